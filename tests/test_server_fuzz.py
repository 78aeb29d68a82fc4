"""No client input makes `pyrodash serve` answer 5xx or break its own schema: fuzzing over real HTTP, real tiny
models, bounded in examples (and so in time).

1. schemathesis reads the server's own OpenAPI document and generates requests that fit it and requests that
   break it (positive and negative modes) for every operation, and runs ALL its checks on every response (as
   `st run --checks all`): no 5xx, status codes / content types / headers / bodies as the schema declares them,
   schema-violating requests rejected, schema-valid ones accepted, 405 with Allow, auth not ignored.
2. hypothesis posts arbitrary JSON, and valid requests with one field replaced by arbitrary JSON, to both
   completion routes; every refusal must be OpenAI's error body.
Both models run in process (the HTTP LLM path is covered in test_server.py); max_tokens is capped at 4, so every
accepted request runs the Collaborate Engine for real and quickly.
"""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_server import KEY, UvicornThread, make_engine, serve_config, tiny_llm, tiny_slm

from pyrodash.server.app import build_app
from pyrodash.server.config import Limits

schemathesis = pytest.importorskip("schemathesis")
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import CHECKS, load_all_checks  # noqa: E402

load_all_checks()
# Refusals no JSON schema can express are not "valid data rejected": a body over limits.max_body_bytes (413), a
# prompt longer than the model's context (400 context_length_exceeded), a lone UTF-16 surrogate (400
# invalid_unicode: JSON Schema strings admit them, valid Unicode does not) and what the served model's own chat
# template cannot show (400 unsupported_for_model: tools or a tool turn to a model whose template has no place for
# them, as the tiny world models here, said as "chat template" in Anthropic's code-less error body too;
# tests/test_tools_fuzz.py fuzzes a server whose models take tools).
UNSCHEMABLE = (b'"context_length_exceeded"', b'"invalid_unicode"', b'"unsupported_for_model"', b"chat template")


def positive_data_acceptance_within_limits(ctx, response, case):
    if response.status_code == 413 or (response.status_code == 400 and any(c in response.content for c in UNSCHEMABLE)):
        return None
    return schemathesis.checks.positive_data_acceptance(ctx, response, case)


def negative_data_rejection_413_included(ctx, response, case):
    if response.status_code == 413:  # refused for its size before its content was read: a rejection too
        return None
    return schemathesis.checks.negative_data_rejection(ctx, response, case)


WRAPPED = ("positive_data_acceptance", "negative_data_rejection")
ALL_CHECKS = [c for c in CHECKS.get_all() if c.__name__ not in WRAPPED] + [
    positive_data_acceptance_within_limits,
    negative_data_rejection_413_included,
]

FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    config = serve_config(limits=Limits(max_body_bytes=4 * 1024, max_tokens=3, default_max_tokens=3))
    engine = make_engine(tiny_slm(tmp_path_factory), tiny_llm(tmp_path_factory), config)
    with UvicornThread(build_app(config, engine=engine), log_level="error") as srv:
        yield srv


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as c:
        yield c


def _check(status: int, headers, text: str) -> None:
    """Never a 5xx; a refusal is OpenAI's error body; an accepted stream ends with [DONE] and carries no error."""
    ctype = _header(headers, "content-type")
    assert status < 500, f"{status}: {text[:500]}"
    if status >= 400:
        err = json.loads(text)["error"]
        assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str)
        assert list(err) == ["message", "type", "param", "code"]
    if status == 200 and ctype.startswith("text/event-stream"):
        assert text.rstrip().endswith("data: [DONE]") and '"error"' not in text


def _header(headers, name: str) -> str:
    value = headers.get(name) or headers.get(name.title()) or ""
    return value[0] if isinstance(value, list) else value


PATHS = [
    ("/v1/chat/completions", "POST"),
    ("/v1/completions", "POST"),
    ("/v1/models", "GET"),
    ("/v1/models/{model_id}", "GET"),
    ("/health", "GET"),
    ("/metrics", "GET"),
]


# GET routes take nothing a request could get wrong (any model id is a valid string): positive mode only
CASES = [
    (p, m, g)
    for p, m in PATHS
    for g in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if m == "POST" or g == GenerationMode.POSITIVE
]


def schemathesis_run(url: str, path: str, method: str, mode, check) -> None:
    """schemathesis on one operation of the server at `url` (its own OpenAPI document) in `mode`, ALL_CHECKS on every
    response and `check(status, headers, text)` after them, FUZZ's examples (the fuzz tests of every route)."""
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    strategy = schema[path][method].as_strategy(generation_mode=mode)

    @FUZZ
    @given(case=strategy)
    def run(case):
        r = case.call_and_validate(base_url=url, headers=AUTH, checks=ALL_CHECKS, timeout=60)
        check(r.status_code, r.headers, r.text)

    run()


@pytest.mark.parametrize(("path", "method", "mode"), CASES, ids=[f"{p}-{g.value}" for p, _, g in CASES])
def test_schemathesis_all_checks(server, path, method, mode):
    schemathesis_run(server.url, path, method, mode, _check)


def _post(http: httpx.Client, route: str, content: str | bytes) -> None:
    r = http.post(route, content=content)  # json.dumps, not httpx's json=: NaN and Infinity must reach the server
    _check(r.status_code, r.headers, r.text)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids, max_size=4),
    max_leaves=12,
)
FIELDS = [
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "n",
    "logprobs",
    "offload_bias",
    "user",
]


@FUZZ
@given(body=JSON, route=st.sampled_from(["/v1/chat/completions", "/v1/completions"]))
def test_arbitrary_json_bodies_get_4xx_not_5xx(http, body, route):
    _post(http, route, json.dumps(body))


@FUZZ
@given(field=st.sampled_from(FIELDS), value=JSON, stream=st.booleans())
def test_one_wrong_field_in_a_valid_request(http, field, value, stream):
    body = {
        "model": "pyrodash",
        "messages": [{"role": "user", "content": "1+1"}],
        "prompt": "1+1",
        "max_tokens": 3,
        "stream": stream,
    }
    body[field] = value
    for route in ("/v1/chat/completions", "/v1/completions"):
        _post(http, route, json.dumps(body))


@FUZZ
@given(raw=st.binary(max_size=200))
def test_arbitrary_bytes(http, raw):
    _post(http, "/v1/chat/completions", raw)
