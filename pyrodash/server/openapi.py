"""The server's OpenAPI document: the request models (read by hand in the routes) in its components, every error a
route can answer (its API's error body), this server's token limits, and /metrics as Prometheus text."""

from __future__ import annotations

from fastapi import FastAPI
from pydantic import BaseModel

from pyrodash.server.config import ServeConfig


def request_body(model: type[BaseModel]) -> dict:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
        }
    }


_ERRORS = {
    400: "Invalid request: malformed JSON, a wrong type or value, an unsupported or unknown parameter, a message "
    "without content, lone surrogates, or prompt + max_tokens over the context length (code "
    "context_length_exceeded)",
    401: "Missing or wrong API key (when the server has one)",
    404: "Unknown model",
    413: "Request body over limits.max_body_bytes",
    429: "A budget reached its hard cap (budgets: at_cap refuse, or the LLM alone asked for); Retry-After says when "
    "its period ends",
    499: "The client closed the request",
    502: "A model backend failed (the body names no backend address; the server log has the details)",
}


def install(app: FastAPI) -> None:
    """Put the request models (read by hand in the routes) into the OpenAPI components, for clients and fuzzers;
    declare every error a route can answer (OpenAI's error body), this server's token limits, and /metrics as
    Prometheus text."""
    from fastapi.openapi.utils import get_openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            fronts = app.state.fronts
            _request_models(schema, app.state.config, fronts)
            _errors(schema, app.state.config, fronts, auth=app.state.api_key is not None)
            _bodies(schema, fronts)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi


def _request_models(schema: dict, config: ServeConfig, fronts) -> None:
    """The request models (one per wire API, `pyrodash.server.front`) and error bodies in the components, with this
    server's token limits and unknown-field rule."""
    comps = schema.setdefault("components", {}).setdefault("schemas", {})
    models = {*(f.wire for f in fronts), *(f.error_model for f in fronts)}
    for model in sorted(models, key=lambda m: m.__name__):
        js = model.model_json_schema(ref_template="#/components/schemas/{model}")
        comps.update(js.pop("$defs", {}))
        comps[model.__name__] = js
    for name in (f.wire.__name__ for f in fronts):
        # unknown top-level fields are a 400 (validation.parse) unless the config lets them pass
        comps[name]["additionalProperties"] = config.allow_unknown_fields
        props = comps[name]["properties"]
        for key in ("max_tokens", "max_completion_tokens", "max_output_tokens", "max_tokens_per_model"):
            if key in props:
                for branch in props[key].get("anyOf", [props[key]]):
                    if branch.get("type") == "integer":
                        branch["maximum"] = config.limits.max_tokens


def _errors(schema: dict, config: ServeConfig, fronts, auth: bool) -> None:
    """Every error each route can answer, as its API's error body (no 401 without a key, no 422)."""
    shapes = {f.route: f.error_model.__name__ for f in fronts}
    for path, item in schema.get("paths", {}).items():
        ref = f"#/components/schemas/{shapes.get(path, 'ErrorResponse')}"
        err = {"content": {"application/json": {"schema": {"$ref": ref}}}}
        for op in item.values():
            responses = op.setdefault("responses", {})
            responses.pop("422", None)  # FastAPI's default; this server answers 400 for invalid input
            codes = [400, 401, 404, 413, 499, 502] if path in shapes else [400, 404]
            if path in shapes and config.budgets is not None:
                codes.append(429)
            if path in ("/health", "/metrics"):
                codes = [401] if path == "/metrics" and not config.metrics_public else []
            for code in codes:
                if code == 401 and not auth:
                    continue
                responses[str(code)] = {"description": _ERRORS[code], **err}
            responses["405"] = {
                "description": "Method not allowed (the Allow header lists the methods)",
                "headers": {"Allow": {"schema": {"type": "string"}}},
                **err,
            }


def _bodies(schema: dict, fronts) -> None:
    """The completions' event stream, /metrics as text and /health's 503."""
    for path in (f.route for f in fronts):
        ok = schema["paths"][path]["post"]["responses"]["200"]
        ok["description"] = "The answer (JSON), or with stream: true its server-sent events"
        event = {"type": "object", "properties": {"event": {"type": "string"}, "data": {"type": "string"}}}
        ok.setdefault("content", {})["text/event-stream"] = {"schema": event}
    metrics_ok = schema["paths"]["/metrics"]["get"]["responses"]["200"]
    metrics_ok["content"] = {"text/plain": {"schema": {"type": "string"}}}
    health = schema["paths"]["/health"]["get"]["responses"]
    health["503"] = {
        "description": "A backend is unreachable (status: degraded)",
        "content": {"application/json": {"schema": {"type": "object"}}},
    }
