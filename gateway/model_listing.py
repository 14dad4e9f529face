"""What ``/v1/models`` shows a tenant: vLLM's listing, cut to the models the tenant may call."""

from __future__ import annotations

from typing import Any

from gateway.errors import InvalidRequest, ModelNotFound, shown
from gateway.tenants import Tenant


def visible_listing(listing: dict[str, Any], tenant: Tenant) -> dict[str, Any]:
    """vLLM's ``/v1/models`` listing without the models ``tenant`` may not call, and without the servers'
    file paths (vLLM's ``root`` and ``parent`` name where a model or adapter was loaded from)."""
    return {**listing, "data": [_without_paths(m) for m in listing.get("data", [])
                                if tenant.may_use_model(str(m.get("id")))]}


def _without_paths(model: dict[str, Any]) -> dict[str, Any]:
    """A listing entry with each local path (``/...``, ``./...``) replaced by the model's id."""
    return {key: model.get("id") if key in ("root", "parent") and _is_local_path(value) else value
            for key, value in model.items()}


def _is_local_path(value: Any) -> bool:
    return isinstance(value, str) and (value.startswith(("/", "./", "../", "~")) or "\\" in value)


def model_entry(listing: dict[str, Any], tenant: Tenant, model_id: str) -> dict[str, Any]:
    """One model of the listing (OpenAI's ``GET /v1/models/{model}``); 404 for a model the tenant cannot see,
    whether it is served or not, so a listing never tells a tenant what others may call."""
    for model in visible_listing(listing, tenant)["data"]:
        if model.get("id") == model_id:
            return model
    raise ModelNotFound(f"The model `{shown(model_id)}` does not exist.", param="model")


def check_served(model: str, served: str, tenant: Tenant) -> None:
    """Raise unless ``model`` is the ``served`` model: 422 when a request names none, 404 for another. The
    404 names the served model only to a tenant that may call it."""
    if not model:  # OpenAI requires it; naming none is a malformed request, not an unknown model
        raise InvalidRequest("model: Field required", param="model")
    if model != served:
        hint = f"; this gateway serves `{served}`" if tenant.may_use_model(served) else ""
        raise ModelNotFound(f"The model `{shown(model)}` does not exist{hint}.", param="model")
