"""The vLLM release: both builds pin the one the code is built against, and a replica names it when another
is installed (0.33 moved modules the replicas import)."""

import re
import tomllib
from pathlib import Path

import pytest

from replicas.vllm_version import SUPPORTED_VLLM, check_vllm_version, vllm_version_problem

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


@pytest.mark.parametrize("found", ["0.32.0", "0.32.3", "0.32.0+cpu", "dev"])
def test_the_supported_release_and_unknown_builds_pass(found: str) -> None:
    assert vllm_version_problem(found) is None


@pytest.mark.parametrize("found", ["0.33.0", "0.31.2", "1.32.0"])
def test_another_minor_release_is_named_with_the_one_to_install(found: str) -> None:
    problem = vllm_version_problem(found)
    assert problem is not None and found in problem and f"vLLM {SUPPORTED_VLLM}.x" in problem
    assert ".[gpu]" in problem


def test_the_installed_vllm_is_the_supported_release() -> None:
    check_vllm_version()


def test_the_cpu_and_gpu_builds_pin_the_supported_release() -> None:
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    pins = {name: re.fullmatch(r"vllm(?:-cpu)?==(\d+\.\d+)\.\d+", extras[name][0]) for name in ("cpu", "gpu")}
    assert all(pins.values()), extras
    assert {match.group(1) for match in pins.values()} == {SUPPORTED_VLLM}
