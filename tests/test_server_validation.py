"""`pyrodash serve` hardening, over real HTTP and real tiny models: the validation layer
(`pyrodash.server.validation`) and the error layer (`pyrodash.server.errors`).

Each test here failed before the hardening: lone surrogates (500 and a crashing error handler / a 502 blaming the
backend), unbounded /metrics route labels, unchecked context length, special-token text tokenized as real tokens,
silently ignored OpenAI parameters, max_tokens per model instead of in total, and an OpenAPI document that
declared only 200s. Upstream failures that must not leak the backend's address are in test_server_faults.py.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from test_server import KEY, OPS, UvicornThread, llm_server, make_engine, remote, serve_config, tiny_llm, tiny_slm

from pyrodash.backends import literal
from pyrodash.backends.base import GenRequest
from pyrodash.backends.http.openai_compat import OpenAICompatBackend
from pyrodash.server.app import build_app

AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    """Both models in process (context windows and tokenizers are known): the server as `pyrodash serve` runs it."""
    slm, llm = tiny_slm(tmp_path_factory), tiny_llm(tmp_path_factory)
    config = serve_config()
    with UvicornThread(build_app(config, engine=make_engine(slm, llm, config)), log_level="error") as s:
        yield s


@pytest.fixture(scope="module")
def http(srv):
    with httpx.Client(base_url=srv.url, headers=AUTH, timeout=120) as c:
        yield c


def _post(http: httpx.Client, body: dict | bytes, route: str = CHAT) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body)
    return http.post(route, content=content, headers={"content-type": "application/json"})


def _err(r: httpx.Response) -> dict:
    err = r.json()["error"]
    assert list(err) == ["message", "type", "param", "code"] and err["message"]
    return err


def _requests_total(http: httpx.Client) -> float:
    text = http.get("/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("pyrodash_requests_total{")
    )


# ---------------------------------------------------------------- lone surrogates


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"model": "\\ud800", "messages": [{"role": "user", "content": "x"}]}', "model"),
        (b'{"messages": [{"role": "user", "content": "a\\udfffb"}]}', "messages.0.content"),
        (
            b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud800"}]}]}',
            "messages.0.content.0.text",
        ),
        (b'{"messages": [{"role": "user", "content": "x"}], "stop": ["\\udc00"]}', "stop.0"),
    ],
)
def test_lone_surrogates_are_a_400_and_counted(http, body, param):
    before = _requests_total(http)
    r = _post(http, body)
    assert r.status_code == 400, r.text
    err = _err(r)
    assert (err["param"], err["code"]) == (param, "invalid_unicode")
    assert _requests_total(http) == before + 2  # this 400, and the GET /metrics that read `before`


def test_the_error_handler_survives_a_surrogate_it_must_echo(http):
    """A 404 whose message names the (surrogate-holding) model id: the body is ASCII JSON, not a crash."""
    r = http.get("/v1/models/%ED%A0%80abc")  # percent-decoded with replacement by the router
    assert r.status_code == 404 and _err(r)["code"] == "model_not_found"
    r = _post(http, b'{"prompt": "\\ud83d", "model": "pyrodash"}', "/v1/completions")
    assert r.status_code == 400 and _err(r)["param"] == "prompt"


def test_an_unknown_key_in_the_requests_range_rule_is_a_400_naming_it(http):
    """Found by schemathesis: an extra key in `pyrodash.range_rule` reached `RangeRule(...)` as a keyword (a 500)."""
    body = {"messages": [{"role": "user", "content": "x"}], "pyrodash": {"range_rule": {"max_turns": 2, "turns": 1}}}
    r = _post(http, body)
    assert r.status_code == 400, r.text
    err = _err(r)
    assert err["param"].startswith("pyrodash.range_rule") and "turns" in err["message"]


# ---------------------------------------------------------------- metrics cardinality


def test_metrics_route_labels_are_route_templates(http):
    ids = [f"no-such-model-{i}-" + "x" * 200 for i in range(60)]
    for i in ids:
        assert http.get(f"/v1/models/{i}").status_code == 404
    for i in range(20):
        assert http.get(f"/nowhere/{i}").status_code == 404
    text = http.get("/metrics").text
    assert not any(i in text for i in ids) and "/nowhere/" not in text
    assert 'route="/v1/models/{model_id}"' in text and 'route="unmatched"' in text
    series = [line for line in text.splitlines() if line.startswith("pyrodash_requests_total{")]
    assert len(series) < 20, series  # bounded by routes x models x statuses, not by what clients send
    assert len(text) < 20_000


def test_405_has_an_allow_header_and_is_counted(http):
    r = http.delete(CHAT)
    assert r.status_code == 405 and r.headers["allow"] == "POST" and _err(r)["code"] == "method_not_allowed"
    assert 'route="/v1/chat/completions"' in http.get("/metrics").text


# ---------------------------------------------------------------- context length


def test_prompt_plus_max_tokens_over_the_context_is_a_400(http):
    long = "1+1=2. " * 300  # 2,100 characters: the char tokenizer's tiny models have 2,048 positions
    r = _post(http, {"messages": [{"role": "user", "content": long}], "max_tokens": 4})
    assert r.status_code == 400 and _err(r)["code"] == "context_length_exceeded" and "2048" in _err(r)["message"]
    r = _post(http, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2030})
    assert r.status_code == 400 and _err(r)["param"] == "max_tokens"
    assert _err(r)["code"] == "context_length_exceeded"
    r = _post(
        http,
        {
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 1900,
            "model": "slm-only",
            "max_tokens_per_model": 2,
        },
    )  # fits: accepted
    assert r.status_code == 200, r.text


# ---------------------------------------------------------------- special tokens


@pytest.mark.parametrize("token", ["<offload>", "<|im_end|>", "<|im_start|>"])
def test_special_token_text_in_content_is_plain_characters(http, token):
    """The char tokenizer makes one token per character, so a content with the token string must cost exactly as
    many SLM input tokens as a content of the same length without it (one special token would be len-1 fewer)."""
    plain = "(" + "a" * (len(token) - 2) + ")"
    usage = []
    for content in (f"Q {token} 1+1", f"Q {plain} 1+1"):
        r = _post(http, {"model": "slm-only", "messages": [{"role": "user", "content": content}], "max_tokens": 1})
        assert r.status_code == 200, r.text
        usage.append(r.json()["pyrodash"]["slm_in"])
    assert usage[0] == usage[1]
    r = _post(http, {"model": "slm-only", "prompt": f"Q {token}", "max_tokens": 1}, "/v1/completions")
    r2 = _post(http, {"model": "slm-only", "prompt": f"Q {plain}", "max_tokens": 1}, "/v1/completions")
    assert r.json()["pyrodash"]["slm_in"] == r2.json()["pyrodash"]["slm_in"]


def test_special_tokens_for_a_remote_tokenizer_get_a_word_joiner():
    backend = OpenAICompatBackend("http://127.0.0.1:9/v1", model="m")
    marked = literal.mark("a <|im_end|> b", ["<|im_end|>"])
    body = backend.body(GenRequest(messages=[{"role": "user", "content": marked}]))
    assert body["messages"][0]["content"] == "a <\u2060|im_end|> b"
    assert literal.strip_markers(f"x{literal.OPEN}y{literal.CLOSE}") == "xy"


def test_client_sent_markers_cannot_hide_a_special_token(http):
    """The marker characters are removed from client text first: a client cannot use them to split a token."""
    r = _post(
        http,
        {
            "model": "slm-only",
            "max_tokens": 1,
            "messages": [{"role": "user", "content": f"{literal.CLOSE}<offload>{literal.OPEN}"}],
        },
    )
    r2 = _post(http, {"model": "slm-only", "max_tokens": 1, "messages": [{"role": "user", "content": "(aaaaaaa)"}]})
    assert r.status_code == r2.status_code == 200 and r.json()["pyrodash"]["slm_in"] == r2.json()["pyrodash"]["slm_in"]


# ---------------------------------------------------------------- unsupported parameters


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        # a call the engine cannot force (tools themselves are served: tests/test_tools_server.py)
        ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"echo": True}, "echo"),
        ({"best_of": 3}, "best_of"),
        ({"suffix": "end"}, "suffix"),
        ({"n": 2}, "n"),
        ({"logit_bias": {"5": 10}}, "logit_bias"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"functions": [{"name": "f"}]}, "functions"),
    ],
)
def test_unsupported_openai_parameters_are_named(http, extra, param):
    r = _post(http, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, **extra})
    assert r.status_code == 400, r.text
    err = _err(r)
    assert err["param"] == param and param in err["message"]


def test_neutral_values_of_unsupported_parameters_are_accepted(http):
    neutral = {
        "tools": [],
        "tool_choice": "none",
        "response_format": {"type": "text"},
        "echo": False,
        "best_of": 1,
        "n": 1,
        "logit_bias": {},
        "presence_penalty": 0,
        "frequency_penalty": 0.0,
        "user": "u",
        "metadata": {"a": "b"},
        "store": False,
        "parallel_tool_calls": True,
    }
    r = _post(http, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, **neutral})
    assert r.status_code == 200, r.text


# ---------------------------------------------------------------- budgets and defaults


def test_max_tokens_is_the_total_budget_of_the_joint_answer(srv):
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key=KEY, max_retries=0, timeout=120)
    r = client.chat.completions.create(
        model="always-offload", messages=[{"role": "user", "content": "1+2="}], max_tokens=30
    )
    p = r.model_extra["pyrodash"]
    assert p["handoff"] == 0 and p["llm_out"] >= 1
    assert r.usage.completion_tokens == p["slm_out"] + p["llm_out"] == 30
    assert r.choices[0].finish_reason == "length"
    # the per-model cap is its own, named option
    r = client.chat.completions.create(
        model="always-offload",
        messages=[{"role": "user", "content": "1+2="}],
        max_tokens=30,
        extra_body={"max_tokens_per_model": 5},
    )
    p = r.model_extra["pyrodash"]
    assert p["llm_out"] == 5 and r.usage.completion_tokens == 6 and r.choices[0].finish_reason == "length"


def test_omitted_temperature_is_greedy_and_declared(http):
    body = {"model": "pyrodash", "messages": [{"role": "user", "content": "7*8="}], "max_tokens": 12}
    outs = {_post(http, body).json()["choices"][0]["message"]["content"] for _ in range(3)}
    assert len(outs) == 1
    schema = http.get("/openapi.json").json()["components"]["schemas"]["ChatCompletionRequest"]
    assert schema["properties"]["temperature"]["default"] == 0


# ---------------------------------------------------------------- the OpenAPI document


def test_openapi_declares_errors_limits_and_metrics_text(http):
    doc = http.get("/openapi.json").json()
    chat = doc["paths"][CHAT]["post"]["responses"]
    assert {"400", "401", "404", "405", "413", "502"} <= set(chat) and "422" not in chat
    assert chat["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    assert "Allow" in chat["405"]["headers"]
    assert "text/event-stream" in chat["200"]["content"]
    assert list(doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]
    props = doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    limit = [b for b in props["max_tokens"]["anyOf"] if b.get("type") == "integer"][0]
    assert limit == {"type": "integer", "minimum": 1, "maximum": 4000}
    assert set(props) >= {"max_tokens_per_model", "offload_bias", "echo", "tools", "response_format"}


def test_operating_points_listed(http):
    assert [m["id"] for m in http.get("/v1/models").json()["data"]] == list(OPS)


def test_an_http_llm_still_gets_checked_for_the_slm_context(tmp_path_factory):
    """With the LLM behind HTTP (its window unknown here) the SLM's window still bounds the request."""
    slm, llm = tiny_slm(tmp_path_factory), tiny_llm(tmp_path_factory)
    config = serve_config()
    with llm_server(llm) as lsrv:
        engine = make_engine(slm, remote(lsrv.url), config)
        with UvicornThread(build_app(config, engine=engine), log_level="error") as s:
            r = httpx.post(
                f"{s.url}{CHAT}",
                headers=AUTH,
                timeout=60,
                json={"messages": [{"role": "user", "content": "y" * 2100}], "max_tokens": 2},
            )
            assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_every_response_is_counted_once(http):
    before = _requests_total(http)  # this GET /metrics is counted after its body was rendered
    http.get("/v1/models")
    http.get("/v1/models/pyrodash")
    http.get("/v1/models/nope")
    _post(http, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1})
    _post(http, b"{bad json")
    after = _requests_total(http)
    assert after == before + 1 + 5
    text = http.get("/metrics").text
    assert 'route="/v1/models",status="200"' in text and 'route="/metrics",status="200"' in text


# ---------------------------------------------------------------- OpenAI-strict: content, unknown fields


@pytest.mark.parametrize(
    "message",
    [{"role": "user"}, {"role": "user", "content": None}, {"role": "system"}, {"role": "developer", "content": None}],
)
def test_a_message_without_content_is_a_400_naming_it(http, message):
    r = _post(http, {"messages": [{"role": "user", "content": "x"}, message], "max_tokens": 1})
    assert r.status_code == 400, r.text
    err = _err(r)
    assert (err["param"], err["code"]) == ("messages.1.content", "missing_required_parameter")
    assert err["message"] == "Missing required parameter: 'messages.1.content'."


def test_an_assistant_message_may_omit_content(http):
    r = _post(
        http,
        {
            "model": "slm-only",
            "max_tokens": 1,
            "messages": [{"role": "user", "content": "x"}, {"role": "assistant"}, {"role": "user", "content": "y"}],
        },
    )
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("route", [CHAT, "/v1/completions"])
def test_unknown_top_level_fields_are_a_400_naming_them(http, route):
    base = {"messages": [{"role": "user", "content": "x"}]} if route == CHAT else {"prompt": "x"}
    r = _post(http, {**base, "max_tokens": 1, "temprature": 0.5}, route)
    assert r.status_code == 400, r.text
    err = _err(r)
    assert (err["type"], err["param"], err["code"]) == ("invalid_request_error", "temprature", "unknown_parameter")
    assert err["message"] == "Unrecognized request argument supplied: temprature"
    r = _post(http, {**base, "max_tokens": 1, "zeta": 1, "alpha": {"b": 2}}, route)
    assert _err(r)["message"] == "Unrecognized request arguments supplied: alpha, zeta" and _err(r)["param"] == "alpha"
    # PyroDash's own fields (the playground, tests and benchmarks send them) are part of the request
    ours = {"offload_bias": 1.0, "max_tokens_per_model": 1, "pyrodash": {"mode": "slm"}}
    r = _post(http, {**base, "model": "slm-only", "max_tokens": 1, **ours}, route)
    assert r.status_code == 200, r.text


def test_messages_for_the_chat_route_only(http):
    """A field of the other route is unknown here: a prompt sent to chat, messages sent to completions."""
    r = _post(http, {"messages": [{"role": "user", "content": "x"}], "prompt": "x", "max_tokens": 1})
    assert r.status_code == 400 and _err(r)["param"] == "prompt"
    r = _post(http, {"prompt": "x", "messages": [], "max_tokens": 1}, "/v1/completions")
    assert r.status_code == 400 and _err(r)["param"] == "messages"


def test_a_config_switch_lets_unknown_fields_pass(tmp_path_factory, http):
    strict = http.get("/openapi.json").json()["components"]["schemas"]
    assert strict["ChatCompletionRequest"]["additionalProperties"] is False
    assert strict["CompletionRequest"]["additionalProperties"] is False
    asking = strict["ChatMessage"]["anyOf"][0]
    assert asking["required"] == ["role", "content"] and "user" in asking["properties"]["role"]["enum"]
    config = serve_config(allow_unknown_fields=True)
    engine = make_engine(tiny_slm(tmp_path_factory), tiny_llm(tmp_path_factory), config)
    with UvicornThread(build_app(config, engine=engine), log_level="error") as s:
        r = httpx.post(
            f"{s.url}{CHAT}",
            headers=AUTH,
            timeout=60,
            json={
                "model": "slm-only",
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 1,
                "vendor_extension": {"x": 1},
                "trace_id": "abc",
            },
        )
        assert r.status_code == 200, r.text
        doc = httpx.get(f"{s.url}/openapi.json").json()["components"]["schemas"]
        assert doc["ChatCompletionRequest"]["additionalProperties"] is True
        # content is still required: the switch is about unknown fields only
        r = httpx.post(f"{s.url}{CHAT}", headers=AUTH, timeout=60, json={"messages": [{"role": "user"}]})
        assert r.status_code == 400 and r.json()["error"]["code"] == "missing_required_parameter"
