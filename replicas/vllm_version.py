"""The vLLM release this project is built against.

The replicas and the gateway's prompt counter use vLLM's serving, rendering and scheduler classes, whose
module paths move between minor releases (0.33 moved the CLI argument parser and split the chat
utilities into a package). Both builds (pyproject's ``cpu`` and ``gpu`` extras) pin the same release, and
a replica refuses to start on another minor release with a message that says which to install, instead of
an ImportError from deep inside its start.
"""

from __future__ import annotations

SUPPORTED_VLLM = "0.32"  # major.minor; any patch release of it


def vllm_version_problem(found: str) -> str | None:
    """Why vLLM ``found`` (its ``__version__``) cannot run this project's replicas, or None when it can (or
    when it cannot tell: a source build without a release number reports "dev")."""
    release = found.split("+")[0].split(".")
    if len(release) < 2 or not release[0].isdigit() or ".".join(release[:2]) == SUPPORTED_VLLM:
        return None
    return (f"fleetgate runs vLLM {SUPPORTED_VLLM}.x, and this environment has vLLM {found}: install the "
            f"project's pinned build (pip install -e '.[gpu]' on a GPU machine, '.[cpu]' on a CPU one).")


def check_vllm_version() -> None:
    """Raise RuntimeError when the installed vLLM is not the release this project is built against."""
    import vllm

    problem = vllm_version_problem(vllm.__version__)
    if problem:
        raise RuntimeError(problem)
