"""The gateway's OpenAPI document, with the request bodies (vLLM's own protocol models) and headers.

The handlers read the raw body (to answer malformed JSON with OpenAI's error), so FastAPI cannot infer the
body schema; it is added here from the same pydantic models the gateway validates with. Clients and
fuzzers (schemathesis, in the tests) then see the real contract.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

_BODIES = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}
_HEADERS = [
    ("x-priority", "The band by name (e.g. interactive, standard, batch)."),
    ("x-gateway-inference-objective", "Alias: an objective name mapped to a band."),
    ("x-gateway-inference-fairness-id", "A flow inside the tenant's fair share."),
    ("x-slo-ttft-ms", "Queueing deadline in milliseconds."),
]


def gateway_openapi(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI document of ``app``, built once, with request bodies, headers and bearer auth."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    from gateway.request_parsing import _request_model

    document = get_openapi(title=app.title, version="1", description=app.description, routes=app.routes)
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    for path, endpoint in _BODIES.items():
        model = _request_model(endpoint)
        body = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(body.pop("$defs", {}))
        schemas[model.__name__] = body
        operation = document["paths"][path]["post"]
        operation["requestBody"] = {"required": True, "content": {
            "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}
        operation["security"] = [{"bearer": []}]
        operation["parameters"] = [{"name": name, "in": "header", "required": False, "description": text,
                                    "schema": {"type": "string"}} for name, text in _HEADERS]
    app.openapi_schema = document
    return document
