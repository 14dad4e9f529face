"""Tenants: who may call the gateway, with which keys, at which priority, how much.

The tenants file (``deploy/tenants.yaml``) is validated with pydantic (unknown fields rejected). API keys
are never stored: only their SHA-256 digests. A key is 256 random bits, so a fast hash is safe to store
(as with GitHub or Stripe tokens) and the lookup hashes the presented key first, so comparing digests
leaks nothing about a stored key. ``fleetgate tenants add-key`` makes a key and prints it once.

Each gateway replica re-reads the file when it changes (checked every ``reload_interval_s``), so tenants
and keys change without a restart; a file that no longer validates is refused and the last good one
stays in force.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

logger = logging.getLogger(__name__)

TENANT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
KEY_PREFIX = "fg-"


def hash_key(api_key: str) -> str:
    """The stored form of an API key: its SHA-256 digest, hex."""
    return hashlib.sha256(api_key.encode("utf-8")).hexdigest()


def new_key() -> str:
    """A fresh API key: ``fg-`` and 256 random bits, URL-safe."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


class ApiKey(BaseModel):
    """One API key of a tenant, stored as its digest."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="Name of the key, to list and revoke it.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the key (hex); the key is never stored.")
    created: str | None = Field(None, description="When the key was made (informational).")


class RateLimits(BaseModel):
    """A tenant's rate limits, enforced in Redis so they hold across every gateway replica."""

    model_config = ConfigDict(extra="forbid")

    requests_per_minute: int | None = Field(None, ge=1, description="Requests admitted per minute (token bucket).")
    tokens_per_minute: int | None = Field(
        None, ge=1, description="Prompt + output tokens per minute (estimate at admission, corrected at the end)."
    )


class Tenant(BaseModel):
    """A tenant: its keys, its fair-share weight, the bands and models it may use, its rate limits."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=TENANT_ID_PATTERN, description="Tenant id (metrics label, queue key).")
    api_keys: list[ApiKey] = Field(default_factory=list, description="Keys that identify this tenant.")
    weight: float = Field(1.0, gt=0, description="Fair-share weight inside a band (token-weighted VTC).")
    max_band: str | None = Field(None, description="Highest band the tenant may use (None: every band).")
    default_band: str | None = Field(None, description="Band of a request that names none (None: the global one).")
    over_allowance: Literal["cap", "reject"] = Field(
        "cap", description="A request above max_band: 'cap' runs it at max_band, 'reject' answers 403."
    )
    models: list[str] = Field(default_factory=lambda: ["*"], description="Models it may call; '*' = all.")
    rate_limits: RateLimits = Field(default_factory=RateLimits, description="Requests and tokens per minute.")

    def may_use_model(self, model: str) -> bool:
        """True when the tenant may call ``model``."""
        return "*" in self.models or model in self.models


class TenantsFile(BaseModel):
    """The whole tenants file."""

    model_config = ConfigDict(extra="forbid")

    tenants: list[Tenant] = Field(default_factory=list, description="Every tenant.")

    @field_validator("tenants", mode="before")
    @classmethod
    def _none_is_empty(cls, tenants: object) -> object:
        return [] if tenants is None else tenants  # `tenants:` with nothing under it yet

    @field_validator("tenants")
    @classmethod
    def _unique(cls, tenants: list[Tenant]) -> list[Tenant]:
        ids = [t.id for t in tenants]
        if len(set(ids)) != len(ids):
            raise ValueError(f"tenant ids must be unique, got {sorted(ids)}")
        digests = [key.sha256 for t in tenants for key in t.api_keys]
        if len(set(digests)) != len(digests):
            raise ValueError("an API key is listed twice")
        return tenants

    def check_bands(self, bands: list[str]) -> TenantsFile:
        """Raise ValueError if a tenant names a band that does not exist or a default above its ceiling."""
        rank = {name: index for index, name in enumerate(bands)}
        for tenant in self.tenants:
            for field, band in (("max_band", tenant.max_band), ("default_band", tenant.default_band)):
                if band is not None and band not in rank:
                    raise ValueError(f"tenant {tenant.id!r}: {field} {band!r} is not one of {bands}")
            if tenant.max_band and tenant.default_band and rank[tenant.default_band] < rank[tenant.max_band]:
                raise ValueError(f"tenant {tenant.id!r}: default_band is above max_band")
        return self

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> TenantsFile:
        """Parse and validate a tenants file (an empty file has no tenants); ValueError says what is wrong."""
        try:
            document = yaml.safe_load(Path(path).read_text())
        except yaml.YAMLError as exc:
            raise ValueError(f"{path} is not valid YAML: {_first_line(str(exc))}") from None
        try:
            return cls.model_validate(document or {})
        except ValidationError as exc:  # one line per problem, where it is: "tenants.0.weight: ..."
            problems = (f"{'.'.join(map(str, error['loc'])) or 'the file'}: {error['msg']}" for error in exc.errors())
            raise ValueError(f"{path}: {'; '.join(problems)}") from None


class TenantRegistry:
    """The tenants in force for one gateway replica: lookup by key digest, reloaded when the file changes."""

    def __init__(self, path: str | None, bands: list[str], reload_interval_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._path = path
        self._clock = clock
        self._bands = bands
        self._reload_interval_s = reload_interval_s
        self._by_digest: dict[str, Tenant] = {}
        self._by_id: dict[str, Tenant] = {}
        self._stamp: tuple[int, int] | None = None
        self.reload_failed: str | None = None  # why the file on disk is not the one in force, if it is not
        self._checked_at = clock()  # the file is read just below
        if path is not None:
            self._install(TenantsFile.read(path).check_bands(bands), self._file_stamp())  # fail loudly at start

    @classmethod
    def of(cls, tenants: list[Tenant], bands: list[str]) -> TenantRegistry:
        """A registry of these tenants, with no file behind it (tests, anonymous-only set-ups)."""
        registry = cls(None, bands)
        registry._install(TenantsFile(tenants=tenants).check_bands(bands), None)
        return registry

    def by_key(self, api_key: str) -> Tenant | None:
        """The tenant this API key belongs to, or None."""
        self.reload_if_changed()
        return self._by_digest.get(hash_key(api_key))

    def by_id(self, tenant_id: str) -> Tenant | None:
        """The tenant with this id, or None."""
        self.reload_if_changed()
        return self._by_id.get(tenant_id)

    def __len__(self) -> int:
        return len(self._by_id)

    def reload_if_changed(self) -> bool:
        """Re-read the file if it changed since the last look (at most once per interval); True if reloaded."""
        now = self._clock()
        if self._path is None or now - self._checked_at < self._reload_interval_s:
            return False
        self._checked_at = now
        stamp = self._file_stamp()
        if stamp == self._stamp:
            return False
        try:
            tenants = TenantsFile.read(self._path).check_bands(self._bands)
        except (OSError, ValueError) as exc:  # read() reports bad YAML and bad fields as ValueError
            # keep the last good tenants; the message names the problem, never a key
            self.reload_failed = _first_line(str(exc))
            logger.error("tenants file %s not reloaded, keeping the previous one: %s", self._path, self.reload_failed)
            self._stamp = stamp
            return False
        self.reload_failed = None
        self._install(tenants, stamp)
        logger.info("tenants file %s reloaded: %d tenants", self._path, len(tenants.tenants))
        return True

    def _install(self, tenants: TenantsFile, stamp: tuple[int, int] | None) -> None:
        self._by_id = {t.id: t for t in tenants.tenants}
        self._by_digest = {key.sha256: t for t in tenants.tenants for key in t.api_keys}
        self._stamp = stamp

    def _file_stamp(self) -> tuple[int, int] | None:
        try:
            stat = os.stat(self._path)  # type: ignore[arg-type]
        except OSError:
            return None
        return stat.st_mtime_ns, stat.st_size


def _first_line(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip())[:300]
