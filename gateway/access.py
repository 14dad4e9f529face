"""Who is calling, and what they may do: authentication, model permission, the request's band.

``Authorization: Bearer <key>`` names the tenant (401 for a missing, malformed or unknown key). Where
``access.allow_anonymous`` is on (the explicit local mode), a request without the header runs as the
anonymous tenant, or, with ``trust_tenant_header``, as the tenant its ``x-tenant-id`` names, unless that
tenant has API keys (then only a key names it: 401). A key in this
gateway's format (``fg-...``) is always checked: an unknown one is a 401 in every mode, so a mistyped or
revoked key never runs quietly as someone else. In anonymous mode a bearer value of no key's format that
names no tenant is a client's placeholder (the OpenAI SDKs need one; vLLM's docs send ``EMPTY``) and counts
as no key.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from gateway.config import AccessConfig
from gateway.errors import PermissionDenied, Unauthenticated
from gateway.headers import RequestHeaders, read_tenant_id
from gateway.tenants import KEY_PREFIX, Tenant, TenantRegistry, hash_key
from policies.priority import BandDecision, BandNotAllowed, resolve_band


def bearer_key(authorization: str) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` value; None when the value has another form."""
    scheme, _, key = authorization.strip().partition(" ")
    return key.strip() if scheme.lower() == "bearer" and key.strip() else None


class Access:
    """Authentication and authorisation for one gateway replica."""

    def __init__(self, config: AccessConfig, bands: list[str], default_band: str) -> None:
        self.config = config
        self.bands = bands
        self.default_band = default_band
        self.tenants = TenantRegistry(config.tenants_file, bands, config.reload_interval_s)

    def authenticate(self, headers: Mapping[str, str]) -> Tenant:
        """The calling tenant; raises Unauthenticated (401)."""
        authorization = headers.get("authorization")
        if authorization is not None:
            key = bearer_key(authorization)
            if key is None:
                raise Unauthenticated("The Authorization header must be 'Bearer <API key>'.")
            tenant = self.tenants.by_key(key)
            if tenant is not None:
                return tenant
            if not self.config.allow_anonymous or key.startswith(KEY_PREFIX):
                raise Unauthenticated("Invalid API key.")
        elif not self.config.allow_anonymous:
            raise Unauthenticated("Missing API key: send 'Authorization: Bearer <API key>'.")
        tenant_id = self.config.anonymous_tenant
        if self.config.trust_tenant_header:
            tenant_id = read_tenant_id(headers) or tenant_id
        tenant = self.tenants.by_id(tenant_id)
        if tenant is not None and tenant.api_keys:  # its weight, bands and bill are its key holders' alone
            raise Unauthenticated(f"Tenant {tenant_id!r} has API keys: send one ('Authorization: Bearer <API key>').")
        return tenant or Tenant(id=tenant_id)

    @staticmethod
    def check_scrape_key(headers: Mapping[str, str], digest: str | None) -> None:
        """Raise Unauthenticated unless ``digest`` is unset or the bearer key hashes to it (for /metrics)."""
        if digest is None:
            return
        key = bearer_key(headers.get("authorization") or "")
        if key is None or not hmac.compare_digest(hash_key(key), digest):
            raise Unauthenticated("The metrics need the scrape key: 'Authorization: Bearer <scrape key>'.")

    def check_model(self, tenant: Tenant, model: str) -> None:
        """Raise PermissionDenied (403) when the tenant may not call ``model``."""
        if not tenant.may_use_model(model):
            raise PermissionDenied(f"This API key may not use the model `{model}`.", param="model")

    def band(self, tenant: Tenant, asked: RequestHeaders) -> BandDecision:
        """The band the request runs in: what it asked for, capped at the tenant's allowance (or 403)."""
        try:
            return resolve_band(asked.band, self.bands, tenant.default_band or self.default_band,
                                tenant.max_band, tenant.over_allowance)
        except BandNotAllowed as exc:
            raise PermissionDenied(
                f"This API key may not use the {exc.requested!r} band; its highest is {exc.ceiling!r}.",
                param="x-priority",
            ) from None
