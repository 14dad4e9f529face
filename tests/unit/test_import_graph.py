"""The package layering holds: policies are pure, replicas and the fleet client never reach into the
gateway, and no product module imports the tests or the benchmark."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

PRODUCT = ("gateway", "fleet", "replicas", "policies")
# package -> top-level project packages it must never import
FORBIDDEN = {
    "policies": {"gateway", "fleet", "replicas", "tests", "bench"},
    "replicas": {"gateway", "tests", "bench"},
    "fleet": {"gateway", "replicas", "tests", "bench"},
    "gateway": {"tests", "bench"},
}
IO_LIBRARIES = {"redis", "ray", "fastapi", "starlette", "httpx", "aiohttp", "vllm"}


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package", PRODUCT)
def test_no_forbidden_arrow(package: str) -> None:
    for path in sorted((REPO_ROOT / package).rglob("*.py")):
        wrong = _imports(path) & FORBIDDEN[package]
        assert not wrong, f"{path.relative_to(REPO_ROOT)} imports {sorted(wrong)}"


def test_policies_do_no_io() -> None:
    for path in sorted((REPO_ROOT / "policies").rglob("*.py")):
        assert not _imports(path) & IO_LIBRARIES, path.relative_to(REPO_ROOT)


def test_product_files_stay_readable() -> None:
    """No product file over ~400 lines, no function over ~60."""
    for package in PRODUCT:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            source = path.read_text()
            assert source.count("\n") <= 400, path.relative_to(REPO_ROOT)
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    length = node.end_lineno - node.lineno + 1
                    assert length <= 60, f"{path.relative_to(REPO_ROOT)}:{node.lineno} {node.name} has {length} lines"
