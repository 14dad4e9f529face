"""Tenants file, key hashing and reload; authentication, model permission and band capping (pure)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gateway.access import Access
from gateway.config import AccessConfig
from gateway.errors import PermissionDenied, Unauthenticated
from gateway.headers import RequestHeaders
from gateway.tenants import TenantRegistry, TenantsFile, hash_key, new_key

BANDS = ["interactive", "standard", "batch"]


def _write(path: Path, text: str) -> None:
    path.write_text(text)
    stamp = time.time() + 5  # a different mtime, whatever the filesystem's resolution
    os.utime(path, (stamp, stamp))


def _file(tmp_path: Path, key: str, max_band: str = "standard", over: str = "cap") -> Path:
    path = tmp_path / "tenants.yaml"
    _write(path, f"""
tenants:
  - id: acme
    weight: 2
    max_band: {max_band}
    over_allowance: {over}
    models: [tiny-llama]
    api_keys: [{{id: k1, sha256: {hash_key(key)}}}]
  - id: anonymous
    max_band: batch
""")
    return path


def _access(path: Path | None, **overrides) -> Access:
    config = AccessConfig(tenants_file=str(path) if path else None, reload_interval_s=0.001, **overrides)
    return Access(config, BANDS, "standard")


def test_keys_are_random_and_stored_hashed(tmp_path: Path) -> None:
    key = new_key()
    assert key.startswith("fg-") and len(key) > 40 and key != new_key()
    path = _file(tmp_path, key)
    assert key not in path.read_text()
    assert TenantRegistry(str(path), BANDS).by_key(key).id == "acme"


@pytest.mark.parametrize(("authorization", "message"), [
    (None, "Missing API key"), ("Bearer", "must be 'Bearer"), ("Basic abc", "must be 'Bearer"),
    ("Bearer fg-wrong", "Invalid API key"),
])
def test_401_without_a_valid_key(tmp_path: Path, authorization: str | None, message: str) -> None:
    access = _access(_file(tmp_path, new_key()))
    headers = {} if authorization is None else {"authorization": authorization}
    with pytest.raises(Unauthenticated, match=message) as caught:
        access.authenticate(headers)
    assert caught.value.status == 401 and caught.value.headers["WWW-Authenticate"] == "Bearer"


def test_anonymous_mode_is_explicit_and_still_checks_sent_keys(tmp_path: Path) -> None:
    key = new_key()
    access = _access(_file(tmp_path, key), allow_anonymous=True, trust_tenant_header=True)
    assert access.authenticate({}).id == "anonymous"
    assert access.authenticate({}).max_band == "batch"  # the file's anonymous entry applies
    assert access.authenticate({"x-tenant-id": "team-7"}).id == "team-7"
    assert access.authenticate({"authorization": f"Bearer {key}", "x-tenant-id": "team-7"}).id == "acme"
    for unknown in ("Bearer fg-revoked", f"Bearer {key[:-1]}", "Basic abc"):  # this gateway's format: checked
        with pytest.raises(Unauthenticated):
            access.authenticate({"authorization": unknown})
    # a placeholder (the OpenAI SDKs need a key; vLLM's docs send EMPTY) is no key, here only
    assert access.authenticate({"authorization": "Bearer EMPTY"}).id == "anonymous"
    assert access.authenticate({"authorization": "Bearer EMPTY", "x-tenant-id": "team-7"}).id == "team-7"
    with pytest.raises(Unauthenticated):
        _access(_file(tmp_path, key)).authenticate({"authorization": "Bearer EMPTY"})
    untrusting = _access(None, allow_anonymous=True)
    assert untrusting.authenticate({"x-tenant-id": "team-7"}).id == "anonymous"
    # a tenant with keys is never named by the header alone: its weight, bands and bill are its key holders'
    with pytest.raises(Unauthenticated, match="'acme' has API keys") as caught:
        access.authenticate({"x-tenant-id": "acme"})
    assert caught.value.status == 401


def test_model_permission_is_403(tmp_path: Path) -> None:
    key = new_key()
    access = _access(_file(tmp_path, key))
    tenant = access.authenticate({"authorization": f"Bearer {key}"})
    access.check_model(tenant, "tiny-llama")
    with pytest.raises(PermissionDenied) as caught:
        access.check_model(tenant, "other-model")
    assert caught.value.status == 403 and caught.value.param == "model"


def test_band_above_allowance_is_capped_or_refused(tmp_path: Path) -> None:
    key = new_key()
    tenant = _access(_file(tmp_path, key)).authenticate({"authorization": f"Bearer {key}"})
    decision = _access(None).band(tenant, RequestHeaders(band="interactive"))
    assert (decision.band, decision.requested, decision.capped) == ("standard", "interactive", True)
    assert not _access(None).band(tenant, RequestHeaders(band="batch")).capped
    strict = _access(_file(tmp_path, key, over="reject")).authenticate({"authorization": f"Bearer {key}"})
    with pytest.raises(PermissionDenied, match="interactive"):
        _access(None).band(strict, RequestHeaders(band="interactive"))
    assert _access(None).band(strict, RequestHeaders()).band == "standard"  # no ask: the default, not a 403


def test_reload_picks_up_new_keys_and_keeps_the_last_good_file(tmp_path: Path) -> None:
    first, second = new_key(), new_key()
    path = _file(tmp_path, first)
    now = [100.0]
    registry = TenantRegistry(str(path), BANDS, reload_interval_s=2.0, clock=lambda: now[0])
    _write(path, path.read_text().replace(hash_key(first), hash_key(second)))
    assert registry.by_key(first).id == "acme", "the file is not looked at again within the interval"
    now[0] += 2.0
    assert registry.by_key(second).id == "acme" and registry.by_key(first) is None
    assert registry.reload_failed is None
    _write(path, "tenants: [{id: acme, colour: blue}]")  # invalid: unknown field
    now[0] += 2.0
    assert registry.by_key(second).id == "acme", "a broken file must not lock everyone out"
    assert "colour" in registry.reload_failed, "but it must not fail silently either (metrics, status)"
    _write(path, path.read_text().replace("colour: blue", "weight: 2"))
    now[0] += 2.0
    assert registry.by_key(second) is None and registry.reload_failed is None


@pytest.mark.parametrize("text", [
    "tenants: [{id: a}, {id: a}]",
    "tenants: [{id: 'bad id'}]",
    "tenants: [{id: a, weight: 0}]",
    "tenants: [{id: a, rate_limits: {requests_per_minute: 0}}]",
])
def test_bad_files_fail_validation(tmp_path: Path, text: str) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(ValueError):
        TenantsFile.read(path)


def test_unknown_band_in_the_file_fails(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("tenants: [{id: a, max_band: urgent}]")
    with pytest.raises(ValueError, match="urgent"):
        TenantRegistry(str(path), BANDS)


def test_shipped_tenants_file_validates() -> None:
    shipped = Path(__file__).resolve().parents[2] / "deploy" / "tenants.yaml"
    tenants = TenantsFile.read(shipped).check_bands(BANDS)
    assert {t.id for t in tenants.tenants} >= {"anonymous", "chat-app", "batch-etl"}


def test_metrics_scrape_key() -> None:
    key = new_key()
    Access.check_scrape_key({}, None)  # unset: open
    Access.check_scrape_key({"authorization": f"Bearer {key}"}, hash_key(key))
    for headers in ({}, {"authorization": "Bearer " + new_key()}, {"authorization": key}):
        with pytest.raises(Unauthenticated):
            Access.check_scrape_key(headers, hash_key(key))
