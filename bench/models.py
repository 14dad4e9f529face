"""The models a benchmark can run: "tiny" (the tests' model; host-bound live runs), "bench" (sized so its
engines, not the host, are the bottleneck), both built here deterministically and cached, or a model
folder (a GPU machine's real model)."""

from __future__ import annotations

from pathlib import Path

from replicas.tiny_model.build import MODEL_SIZES, build_tiny_model, is_built
from tests.support.serve_launcher import REPO_ROOT


def served_name(size: str) -> str:
    """The model's name in the API (``tiny-llama``, ``bench-llama``)."""
    return f"{size}-llama"


def model_path(size: str) -> Path:
    """Where the model's folder is cached."""
    return REPO_ROOT / ".cache" / "models" / served_name(size)


def ensure_model(size: str) -> Path:
    """The model's folder, built first if it is missing or was built from another spec."""
    path, spec = model_path(size), MODEL_SIZES[size]
    if not is_built(path, spec):
        build_tiny_model(path, spec)
    return path


def resolve(model: str) -> tuple[str, Path]:
    """(served name, folder) of a local model's name or of a model folder (served by its folder's name)."""
    if model in MODEL_SIZES:
        return served_name(model), ensure_model(model)
    path = Path(model).expanduser().resolve()
    if not (path / "config.json").is_file():
        raise SystemExit(f"--model: {model!r} is neither {sorted(MODEL_SIZES)} nor a model folder (no config.json)")
    return path.name, path
