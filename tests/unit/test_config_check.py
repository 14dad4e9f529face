"""`fleetgate check CONFIG`: what building a `serve run` config would refuse, said before it is deployed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gateway.cli import main
from gateway.config_check import check_config

REPO = Path(__file__).resolve().parents[2]
LOCAL = REPO / "deploy" / "local.yaml"


def _variant(tmp_path: Path, edit) -> Path:
    document = yaml.safe_load(LOCAL.read_text())
    edit(document["applications"][0]["args"])
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_the_shipped_local_config_passes(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    problems, summaries = check_config(LOCAL, base_dir=str(REPO))
    assert problems == [] and "pools latency x1, throughput x1" in summaries[0]
    monkeypatch.chdir(REPO)  # its paths are read from where `serve run` starts, as Serve reads them
    assert main(["check", "deploy/local.yaml"]) == 0
    assert capsys.readouterr().out.endswith(": ok\n")


@pytest.mark.parametrize(("edit", "says"), [
    (lambda args: args["pools"][0]["engine"].update(max_num_seq=8), "args.pools.0.engine.max_num_seq: Extra inputs"),
    (lambda args: args["pools"][1]["engine"].update(scheduling_policy="fcfs"), "scheduling_policy fcfs"),
    (lambda args: args["queue"].update(default_band="urgent"), "urgent"),
    (lambda args: args["access"].update(tenants_file="missing.yaml"), "access.tenants_file"),
], ids=["typo", "fcfs-under-bands", "unknown-band", "no-tenants-file"])
def test_a_config_that_would_not_build_is_named_line_by_line(tmp_path: Path, edit, says: str,
                                                             capsys: pytest.CaptureFixture) -> None:
    config = _variant(tmp_path, edit)
    problems, _ = check_config(config, base_dir=str(REPO))
    assert any(says in line for line in problems), problems
    assert main(["check", str(config)]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_a_file_that_is_not_a_fleetgate_config_is_said_to_be_so(tmp_path: Path) -> None:
    other = tmp_path / "other.yaml"
    other.write_text("applications: [{name: x, import_path: ray.serve.llm:build_openai_app}]")
    assert "no application with import_path gateway.app:build_app" in check_config(other)[0][0]
    assert "No such file" in check_config(tmp_path / "missing.yaml")[0][0]


def test_the_local_script_checks_its_config_before_serve_run() -> None:
    script = (REPO / "scripts" / "serve-local.sh").read_text()
    check, redis = script.index('fleetgate check "$config"'), script.index('/local-redis.sh"')
    assert check < redis < script.index('exec serve run "$config"')  # a refused config starts nothing
