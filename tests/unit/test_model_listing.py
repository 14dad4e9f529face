"""What /v1/models shows a tenant: only the models it may call, one at a time or all."""

import pytest

from gateway.errors import ModelNotFound
from gateway.model_listing import check_served, model_entry, visible_listing
from gateway.tenants import Tenant

LISTING = {"object": "list", "data": [{"id": "llama", "object": "model"}, {"id": "org/coder", "object": "model"}]}


def test_a_tenant_sees_the_models_it_may_call() -> None:
    assert [m["id"] for m in visible_listing(LISTING, Tenant(id="all"))["data"]] == ["llama", "org/coder"]
    assert [m["id"] for m in visible_listing(LISTING, Tenant(id="one", models=["org/coder"]))["data"]] == ["org/coder"]
    assert visible_listing(LISTING, Tenant(id="one", models=["org/coder"]))["object"] == "list"


def test_retrieving_a_model_the_tenant_may_not_call_is_404_like_one_not_served() -> None:
    tenant = Tenant(id="one", models=["org/coder"])
    assert model_entry(LISTING, tenant, "org/coder")["id"] == "org/coder"
    for hidden in ("llama", "missing"):
        with pytest.raises(ModelNotFound):
            model_entry(LISTING, tenant, hidden)


def test_an_unknown_model_is_404_naming_the_served_one_only_to_its_users_and_never_echoing_megabytes() -> None:
    check_served("llama", "llama", Tenant(id="all"))
    with pytest.raises(ModelNotFound, match="this gateway serves `llama`"):
        check_served("gpt-4", "llama", Tenant(id="all"))
    with pytest.raises(ModelNotFound) as caught:
        check_served("gpt-4", "llama", Tenant(id="coder-only", models=["org/coder"]))
    assert "llama" not in caught.value.message
    with pytest.raises(ModelNotFound) as caught:
        check_served("x" * 100_000, "llama", Tenant(id="all"))
    assert len(caught.value.message) < 400
    with pytest.raises(ModelNotFound) as caught:
        model_entry(LISTING, Tenant(id="all"), "y" * 100_000)
    assert len(caught.value.message) < 400


def test_the_listing_never_shows_a_tenant_where_the_server_keeps_its_models() -> None:
    listing = {"object": "list", "data": [
        {"id": "llama", "object": "model", "root": "/models/Meta-Llama-3.1-8B-Instruct", "parent": None},
        {"id": "sql-lora", "object": "model", "root": "./adapters/sql", "parent": "../base"},
        {"id": "hub", "object": "model", "root": "meta-llama/Llama-3.1-8B", "parent": None},
    ]}
    shown = {m["id"]: (m["root"], m["parent"]) for m in visible_listing(listing, Tenant(id="all"))["data"]}
    assert shown == {"llama": ("llama", None), "sql-lora": ("sql-lora", "sql-lora"),
                     "hub": ("meta-llama/Llama-3.1-8B", None)}  # a hub id is public; a path is not
    assert model_entry(listing, Tenant(id="all"), "llama")["root"] == "llama"
