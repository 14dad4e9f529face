"""`fleetgate tenants` edits the file in place (comments kept, keys hashed); `fleetgate status` renders."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from fleet.snapshot import QueueSnapshot
from gateway.cli import _gateway_gauge, _gateways_flagging, main
from gateway.metrics import GatewayMetrics
from gateway.status_view import render_status
from gateway.tenants import TenantRegistry, TenantsFile

BANDS = ["interactive", "standard", "batch"]


def test_add_key_prints_it_once_and_stores_only_its_hash(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text("# our tenants\ntenants:\n  - id: acme   # the first customer\n    weight: 3\n")
    assert main(["tenants", "add-key", str(path), "acme", "--key-id", "ci"]) == 0
    key = capsys.readouterr().out.strip()
    text = path.read_text()
    assert key.startswith("fg-") and key not in text
    assert "# our tenants" in text and "# the first customer" in text
    assert TenantRegistry(str(path), BANDS).by_key(key).id == "acme"
    assert main(["tenants", "add-key", str(path), "acme", "--key-id", "ci"]) == 2  # names are unique
    assert main(["tenants", "add-key", str(path), "nobody"]) == 2
    assert main(["tenants", "add-key", str(path), "newco", "--create"]) == 0
    assert {t.id for t in TenantsFile.read(path).tenants} == {"acme", "newco"}
    assert main(["tenants", "revoke-key", str(path), "acme", "ci"]) == 0
    assert TenantRegistry(str(path), BANDS).by_key(key) is None


def test_check_validates_against_the_configs_bands(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = str(Path(__file__).resolve().parents[2] / "deploy" / "local.yaml")
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("tenants: [{id: a, max_band: batch}]")
    bad.write_text("tenants: [{id: a, max_band: urgent}]")
    assert main(["tenants", "check", str(good), "--config", config]) == 0
    assert main(["tenants", "check", str(bad), "--config", config]) == 2
    assert "urgent" in capsys.readouterr().err


def test_status_view_shows_bands_tenants_replicas_gates_and_gateways() -> None:
    snapshot = QueueSnapshot.model_validate({
        "now_ms": 1_000_000,
        "bands": [{"name": "interactive", "queued": 0, "queued_tokens": 0, "tenants": {}, "counters": {},
                   "max_unstarted_steps": 3, "kv_ceiling": 0.95},
                  {"name": "batch", "queued": 3, "queued_tokens": 900, "max_unstarted_steps": 1.5, "kv_ceiling": 0.8,
                   "tenants": {"etl": {"queued": 3, "queued_tokens": 900}}, "counters": {"etl": "1200"}}],
        "replicas": [{"replica_id": "r1", "pool": "throughput", "slots_total": 4, "slots_free": 1,
                      "tokens_total": 1000, "tokens_free": 400, "accepts": "long,short", "prefers": "long",
                      "expires_ms": 1_004_000},
                     {"replica_id": "r2", "pool": "latency", "slots_total": 32, "slots_free": 30, "tokens_total": 10**5,
                      "tokens_free": 10**5, "accepts": "short", "prefers": "short", "expires_ms": 1_004_000,
                      "fresh": True, "pending": 700, "step_tokens": 512, "unstarted": 2, "in_flight": 1,
                      "running": 5, "waiting": 1, "kv_usage": 0.42, "signals_at_ms": 999_800,
                      "open_bands": ["interactive"]}],
        "stats": {"granted": 10, "completed": 7}, "tickets": 6,
    })
    view = render_status(snapshot, "local", "redis://127.0.0.1:6399/0", ["gateway:gw-a", "replica:r1"])
    assert "etl" in view and "3/4" in view and "throughput" in view and "<1.5 steps, kv<0.8" in view
    r1, r2 = (next(line for line in view.splitlines() if line.startswith(r)) for r in ("r1 ", "r2 "))
    assert "none (slot cap)" in r1 and "600/2048" not in r1  # no signals yet: the concurrency cap
    assert all(cell in r2 for cell in ("700/512", "2+1 in flight", "0.42", "0.2s ago", "interactive"))
    assert "gateways publishing: 1 (gw-a)" in view and "granted=10" in view
    counted = render_status(snapshot, "local", "redis://x", ["gateway:gw-a"], open_requests={"gw-a": 12.0})
    assert "gateways publishing: 1 (gw-a: 12 requests open)" in counted
    assert "WARNING" not in view and "lua=" not in view
    assert "lua=scripts" in render_status(snapshot, "local", "redis://x", [], lua_form="scripts").splitlines()[0]
    warned = render_status(snapshot, "local", "redis://127.0.0.1:6399/0", ["gateway:gw-a"], ["gw-a"])
    assert "WARNING: gateway gw-a could not reload the tenants file" in warned
    assert "header guard" not in warned
    unguarded = render_status(snapshot, "local", "redis://x", ["gateway:gw-a"], unguarded=["gw-a"])
    assert "WARNING: gateway gw-a runs on a node whose Ray started without the header guard: set " \
           "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=gateway.http_guard.middlewares" in unguarded
    assert "behind the wall clock" not in view
    cut = render_status(snapshot.model_copy(update={"wall_ms": 1_030_000}), "local", "redis://127.0.0.1:6399/0", [])
    assert "the queue's clock runs 30.0 s behind the wall clock" in cut


def test_add_key_changes_nothing_else_in_the_shipped_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    shipped = (Path(__file__).resolve().parents[2] / "deploy" / "tenants.yaml").read_text()
    path = tmp_path / "tenants.yaml"
    path.write_text(shipped)
    assert main(["tenants", "add-key", str(path), "batch-etl", "--key-id", "k"]) == 0
    diff = [line for line in difflib.ndiff(shipped.splitlines(), path.read_text().splitlines())
            if line[:1] in "+-"]
    assert [line[:2] for line in diff] == ["- ", "+ ", "+ ", "+ ", "+ "], diff
    assert diff[0] == "-     api_keys: []" and diff[1:3] == ["+     api_keys:", "+       - id: k"]


def test_status_says_when_redis_cannot_be_reached_without_a_traceback_or_the_password(
        capsys: pytest.CaptureFixture) -> None:
    assert main(["status", "--redis-url", "redis://:hunter2@127.0.0.1:1/0"]) == 1
    err = capsys.readouterr().err
    assert "cannot read the global queue at redis://***@127.0.0.1:1/0" in err
    assert "Traceback" not in err and "hunter2" not in err


def test_an_unknown_tenant_is_named_plainly(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "t.yaml").write_text("tenants:\n  - id: a\n")
    assert main(["tenants", "add-key", str(tmp_path / "t.yaml"), "b"]) == 2
    assert capsys.readouterr().err == f"fleetgate: no tenant 'b' in {tmp_path / 't.yaml'} (use --create to add it)\n"


def test_the_default_config_is_found_from_any_directory(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    shipped = Path(__file__).resolve().parents[2] / "deploy" / "tenants.yaml"
    monkeypatch.chdir(tmp_path)  # no deploy/ here: the installed checkout's deploy/local.yaml is used
    assert main(["tenants", "check", str(shipped)]) == 0
    assert main(["tenants", "check", str(shipped), "--config", "missing.yaml"]) == 2
    assert "no Serve config at missing.yaml: pass --config" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["tenants: [\n", "- a\n- b\n", "tenants:\n  - id: 'bad id!'\n"])
def test_a_file_gateways_would_refuse_is_named_plainly_and_left_as_it_is(
        tmp_path: Path, capsys: pytest.CaptureFixture, text: str) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text(text)
    assert main(["tenants", "check", str(path)]) == 2
    assert main(["tenants", "add-key", str(path), "acme", "--create"]) == 2
    assert main(["tenants", "revoke-key", str(path), "acme", "k"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "errors.pydantic.dev" not in err and err.count("fleetgate: ") == 3
    assert len(err.splitlines()) == 3  # one line each, naming the file
    assert all(str(path) in line for line in err.splitlines())
    assert path.read_text() == text


def test_a_tenants_key_with_nothing_under_it_is_an_empty_list(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "tenants.yaml"
    path.write_text("# ours\ntenants:\n")
    assert TenantsFile.read(path).tenants == []
    assert main(["tenants", "add-key", str(path), "acme", "--create"]) == 0
    assert [t.id for t in TenantsFile.read(path).tenants] == ["acme"]
    assert path.read_text().startswith("# ours\n")


@pytest.mark.parametrize("interval", ["0", "-1", "nan", "soon"])
def test_watch_refuses_an_interval_that_would_hammer_redis(interval: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["status", "--watch", interval])
    assert exit_.value.code == 2 and "--watch" in capsys.readouterr().err


def test_status_reads_each_gateways_gauges_from_what_it_published() -> None:
    metrics = GatewayMetrics(True, 10)
    metrics.open_requests.set(7)
    published = [({"gateway": "gw-a"}, generate_latest(metrics.registry).decode()), ({"gateway": "gw-b"}, "")]
    assert _gateway_gauge(published, "fleetgate_gateway_open_requests") == {"gw-a": 7.0}
    metrics.header_guard_missing.set(1)
    quiet = GatewayMetrics(True, 10)
    published = [({"gateway": "gw-a"}, generate_latest(metrics.registry).decode()),
                 ({"gateway": "gw-b"}, generate_latest(quiet.registry).decode())]
    assert _gateways_flagging(published, "fleetgate_header_guard_missing") == ["gw-a"]
