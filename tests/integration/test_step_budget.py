"""vLLM's own scheduler (the CPU build, the tiny model, a real engine) steps by the work it holds: the
guarded step while it holds only a long prompt, the pool's own budget from the moment a short request is in
the engine until it finishes (policies/step_budget.py, replicas/step_budget.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.support.step_budget_engine import OUTPUT_TOKENS

pytestmark = pytest.mark.integration


def test_a_long_prompt_alone_gets_the_guarded_step_and_a_short_request_takes_it_back(tiny_model_path: Path) -> None:
    probe = subprocess.run([sys.executable, "-m", "tests.support.step_budget_engine", str(tiny_model_path)],
                           cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr[-3000:]
    steps = json.loads(probe.stdout.strip().splitlines()[-1])

    alone = steps["alone"]
    assert {s["budget"] for s in alone} == {1024}
    assert alone[0]["tokens"] == 1024  # 8x the pool's own 128-token step, not cut to its 64-token chunk

    beside = steps["beside_short"]
    budgets = [s["budget"] for s in beside]
    # the short request is in the engine for its prefill step and its decodes: the small step all that while
    assert budgets == [128] * OUTPUT_TOKENS + [1024] * (len(beside) - OUTPUT_TOKENS)
    assert all(s["tokens"] <= 128 for s in beside[:OUTPUT_TOKENS])
    assert beside[OUTPUT_TOKENS]["tokens"] > 128  # then the long prompt's prefill takes the large step
