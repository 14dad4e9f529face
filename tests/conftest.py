"""Shared fixtures: the tiny local model, and the environment every Ray test needs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
TINY_MODEL_DIR = REPO_ROOT / ".cache" / "models" / "tiny-llama"
TINY_MODEL_NAME = "tiny-llama"

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    """The tiny local model folder, built on first use."""
    from replicas.tiny_model.build import build_tiny_model, is_built

    if not is_built(TINY_MODEL_DIR):
        build_tiny_model(TINY_MODEL_DIR)
    return TINY_MODEL_DIR


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory):
    """URL of a real redis-server started for this test session."""
    from tests.support.local_redis import running_redis

    with running_redis(tmp_path_factory.mktemp("redis")) as url:
        yield url
