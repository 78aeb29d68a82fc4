"""Start-up probes of an LLM endpoint: which continuation mode it takes, whether it is reachable at all.

    rep = probe_llm(backend)      # ProbeReport: model served, key accepted, mode (detected / verified), usage
    print("\\n".join(rep.lines()))   # what `pyrodash check` prints
    status = await reachability(backend)   # {name, reachable, error?, endpoints?}: /health, an LLM mesh's health

Mode auto tries `continue` (vLLM/SGLang), `completion` (a local tokenizer renders the chat template), `prefix`
(DeepSeek), then `instruct`; an Anthropic-shaped provider gets `anthropic` first. A field the endpoint refuses is
adapted and the request sent again. A mode that continues a prefix must show it (fewer prompt tokens than the same
text as a closed turn); when counts cannot tell, the provider's shape (`ProbeReport.seen`) picks, and
`ProbeReport.warning` says so. A wrong key, model or mode is `error`: one line naming the fix. The SLM's check is
`pyrodash.backends.http.slm_probe`.
"""

from __future__ import annotations

import asyncio
import re
import threading
from dataclasses import dataclass, field
from urllib.parse import urlparse

import httpx

from pyrodash.backends.base import BackendError, ChecksHealth, GenChunk, GenRequest, Meshed
from pyrodash.backends.http.continuation import Wire
from pyrodash.chat import CALL_OPEN

PROBE_MSGS = [{"role": "user", "content": "Count on: 1, 2, 3"}]
PROBE_PREFIX = "1, 2, 3, 4"
ADAPTABLE = ("temperature", "top_p", "seed", "stream_options")
_FIELD_PATTERNS = (
    r"Unrecognized request argument supplied: (\w+)",
    r"Unsupported parameter: '(\w+)'",
    r"'(\w+)' is not supported",
    r"Unexpected fields in the request: \{([^}]*)\}",
    r"(\w+): Extra inputs are not permitted",
    r"unknown field[: ]+'?(\w+)",
    r"temperature`? and `?(top_p)`? cannot both be specified",
)  # Anthropic: drop top_p
# what names an Anthropic-shaped provider in an error text (also wrapped by a proxy: LiteLLM's "AnthropicException")
_ANTHROPIC_ERROR_SIGNS = (
    (r"AnthropicException", "an AnthropicException (LiteLLM's wrapper of an Anthropic error)"),
    (r'"type"\s*:\s*"error"\s*,\s*"error"\s*:\s*\{\s*"type"', "an Anthropic error object"),
    (r"temperature`? and `?top_p`? cannot both be specified", "Anthropic's refusal of temperature with top_p"),
)


def run_sync(coro):
    """Run `coro` to completion from sync code, also when called inside a running event loop (own thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    out: dict = {}

    def target() -> None:
        try:
            out["v"] = asyncio.run(coro)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            out["e"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join()
    if "e" in out:
        raise out["e"]
    return out["v"]


def rejected_fields(err: BackendError) -> set[str]:
    """The request fields an error says were refused (OpenAI's `param`, or named in the message)."""
    found = {err.param} if err.param else set()
    for pat in _FIELD_PATTERNS:
        for m in re.finditer(pat, str(err)):
            found |= {x.strip(" '\"") for x in m.group(1).split(",")}
    return {f for f in found if f}


@dataclass
class ProbeReport:
    url: str
    model: str | None
    configured_mode: str
    key_env: str | None
    key_sent: bool
    reachable: bool = False
    models_listed: list[str] | None = None
    model_served: bool | None = None
    key: str = "unknown"
    mode: str | None = None
    mode_reason: str = ""
    usage_reported: bool | None = None
    tried: list[str] = field(default_factory=list)
    provider: str | None = None  # the provider's shape, when something named it: "anthropic"
    seen: list[str] = field(default_factory=list)  # what named it
    warning: str | None = None  # the mode was picked by the provider's shape: the measurement could not tell
    error: str | None = None
    tools: str | None = None  # whether tool calls work in the mode found (`probe_tools`)

    def lines(self) -> list[str]:
        served = {True: "yes", False: "no", None: "unknown"}[self.model_served]
        listed = (
            ""
            if self.models_listed is None
            else (
                f" (the server lists: {', '.join(self.models_listed[:8])})"
                if self.models_listed
                else " (the server lists none)"
            )
        )
        usage = {True: "yes", False: "no (counted locally or estimated, marked usage_estimated)", None: "unknown"}[
            self.usage_reported
        ]
        out = [
            f"LLM endpoint      {self.url}",
            f"  reachable       {'yes' if self.reachable else 'no'}",
            f"  model           {self.model or '?'}: served {served}{listed}",
            f"  API key         {self.key}",
            f"  mode            {self.mode or '-'}"
            + (f"  [{self.mode_reason}]" if self.mode_reason else "")
            + ("" if self.configured_mode == "auto" else f" (configured: {self.configured_mode})"),
            f"  usage reported  {usage}",
        ]
        if self.tools:
            out.append(f"  tool calls      {self.tools}")
        out += [f"  tried           {t}" for t in self.tried]
        if self.provider:
            out.append(f"  provider shape  {self.provider} (saw: {'; '.join(self.seen)})")
        if self.warning:
            out.append(f"  WARNING         {self.warning}")
        if self.error:
            out.append(f"  ERROR           {self.error}")
        return out


async def generate_with(backend, req: GenRequest, wire: Wire) -> tuple[str, GenChunk]:
    """(text, last chunk) of one request sent with `wire`; the response's headers land in `backend.last_headers`."""
    text, last = "", GenChunk()
    if hasattr(backend, "last_headers"):
        backend.last_headers = None  # set again by this request's response
    async for ch in backend.stream(req, wire=wire):
        text += ch.text
        if ch.finish_reason is not None:
            last = ch
    return text, last


def _saw(rep: ProbeReport, what: str) -> None:
    """Note a sign of an Anthropic-shaped provider."""
    rep.provider = "anthropic"
    if what not in rep.seen:
        rep.seen.append(what)


def _look(backend, rep: ProbeReport, text: str = "") -> None:
    """Read the provider's shape from an error text and the last response's headers (LiteLLM names the upstream
    model, provider first: `x-litellm-model-name: anthropic/claude-...`)."""
    for pat, what in _ANTHROPIC_ERROR_SIGNS:
        if text and re.search(pat, text):
            _saw(rep, what)
    headers = getattr(backend, "last_headers", None)
    name = headers.get("x-litellm-model-name") if headers is not None else None
    if name and re.search(r"anthropic|claude", name, re.IGNORECASE):
        _saw(rep, f"x-litellm-model-name: {name}")


def _anthropic_listing(obj: object) -> bool:
    """A `GET /models` answer in the Messages API's shape (items `{"type": "model", "display_name": ...}`)."""
    data = obj.get("data") if isinstance(obj, dict) else None
    return isinstance(data, list) and any(
        isinstance(m, dict) and m.get("type") == "model" and "display_name" in m for m in data
    )


async def _get_models(backend, rep: ProbeReport) -> httpx.Response | None:
    base = backend.base
    try:
        r = await backend.client().get(f"{base}/models", timeout=min(backend.timeout_s, 10))
    except httpx.HTTPError as e:
        rep.error = f"cannot reach the LLM at {base} ({type(e).__name__}): start the server or fix the URL in --llm"
        return None
    if (
        r.status_code in (401, 403)
        and backend.endpoint.mode == "auto"
        and backend.provider is None
        and re.search(_ANTHROPIC_ERROR_SIGNS[1][0], r.text)
    ):  # an Anthropic-shaped API refusing a Bearer key: its own headers
        _saw(rep, f"GET /models answered {r.status_code} with an Anthropic error object")
        backend.provider = "anthropic"
        await backend.aclose()
        return await _get_models(backend, rep)
    return r


async def _read_listing(backend, rep: ProbeReport, r: httpx.Response) -> None:
    """What a 200 from GET /models says: the models listed, an Anthropic-shaped listing, the model to use."""
    try:
        listing = r.json()
        rep.models_listed = [str(m["id"]) for m in listing.get("data", [])]
    except (ValueError, KeyError, TypeError, AttributeError):
        listing, rep.models_listed = None, None
    if _anthropic_listing(listing) and backend.endpoint.mode == "auto":
        _saw(rep, "GET /models answered in the Messages API's shape")
        if backend.provider is None:
            backend.provider = "anthropic"
            await backend.aclose()  # the client was opened with OpenAI's headers
    if backend.known_model is None and rep.models_listed:
        backend.model = rep.models_listed[0]
    if rep.models_listed is not None and backend.known_model is not None:
        rep.model_served = backend.known_model in rep.models_listed


async def _find_model(backend, rep: ProbeReport) -> bool:
    """Reach the endpoint, check the key and settle the model (`rep.model`); False with `rep.error` when not."""
    r = await _get_models(backend, rep)
    if r is None:
        return False
    rep.reachable = True
    if r.status_code in (401, 403):
        rep.key = f"rejected (HTTP {r.status_code})"
        rep.error = _key_fix(rep, r.status_code)
        return False
    if r.status_code == 200:
        await _read_listing(backend, rep, r)
    if backend.known_model is None:
        rep.error = f"{backend.base}/models names no model: add '#MODEL' to the --llm URL"
        return False
    rep.model = backend.known_model
    return True


def _candidates(backend, mode: str) -> list[str]:
    """The continuation modes to try, in order (the module docstring)."""
    host = (urlparse(backend.base).hostname or "").lower()
    if mode != "auto":
        return [mode]
    if host.endswith("anthropic.com") or backend.provider == "anthropic":
        return ["anthropic"]  # the Messages API itself (OpenAI-style routes would 404)
    return ["continue"] + (["completion"] if backend.local_tokenizer_dir() else []) + ["prefix"]


def _configured_mode_refused(backend, rep: ProbeReport, mode: str, unsure: list[tuple[str, Wire, str]]) -> None:
    """A configured mode that was not shown to continue: kept for an Anthropic-shaped provider, else an error."""
    if unsure and rep.provider == "anthropic":  # Anthropic continues a final assistant message
        rep.warning = _by_shape(rep, unsure, f"{mode} (configured)")
        return _settle(backend, rep, unsure[0][1], unsure[0][2])
    rep.error = (
        f"--llm-mode {mode}: the LLM at {backend.base} refused it ({rep.tried[-1].split(': ', 1)[1]}); "
        "use --llm-mode auto to detect a mode it takes"
    )


async def _anthropic_behind_proxy(backend, rep: ProbeReport, unsure: list[tuple[str, Wire, str]]) -> bool:
    """An Anthropic-shaped provider behind an OpenAI-style proxy (e.g. LiteLLM): the proxy's Messages API, else the
    first mode it accepted. True when settled (or failed: `rep.error`); False to go on to `instruct`."""
    backend.provider = "anthropic"  # the Messages API's headers for this request and after
    await backend.aclose()
    wire, why, _ = await _try_mode(backend, "anthropic", rep, optional=True)
    if rep.error:
        return True
    rep.tried.append(f"anthropic: {why}")
    if wire is not None:
        rep.warning = _by_shape(rep, unsure, "anthropic, the Messages API (/messages) at the same base URL")
        _settle(backend, rep, wire, why)
        return True
    backend.provider = None
    await backend.aclose()
    if unsure:
        cand, wire, why = unsure[0]
        rep.warning = _by_shape(
            rep, unsure, f"{cand} (no Messages API here; Anthropic continues a final assistant message)"
        )
        _settle(backend, rep, wire, why)
        return True
    return False


async def _instruct(backend, rep: ProbeReport, unsure: list[tuple[str, Wire, str]]) -> bool:
    """The last resort, `instruct` (any chat API). True when settled (or failed: `rep.error`)."""
    wire, why, _ = await _try_mode(backend, "instruct", rep)
    if rep.error:
        return True
    rep.tried.append(f"instruct: {why}")
    if wire is None:
        return False
    if unsure:
        names = " / ".join(c for c, _, _ in unsure)
        rep.warning = (
            f"cannot tell whether {names} continued the trace ({unsure[0][2]}) and nothing named "
            "the provider (no Anthropic sign): picked instruct, as OpenAI treats a final assistant "
            f"message (a closed turn); if this server continues one, set --llm-mode {unsure[0][0]}"
        )
    _settle(backend, rep, wire, why)
    return True


async def _probe(backend, rep: ProbeReport) -> None:
    if not await _find_model(backend, rep):
        return
    mode = backend.endpoint.mode
    cands = _candidates(backend, mode)
    unsure: list[tuple[str, Wire, str]] = []  # accepted, but the counts could not show a continuation
    for cand in cands:
        wire, why, shown = await _try_mode(backend, cand, rep)
        if rep.error:
            return
        rep.tried.append(f"{cand}: {why}")
        if wire is not None and shown:
            return _settle(backend, rep, wire, why)
        if wire is not None:
            unsure.append((cand, wire, why))
    if mode != "auto":
        return _configured_mode_refused(backend, rep, mode, unsure)
    if rep.provider == "anthropic" and "anthropic" not in cands and await _anthropic_behind_proxy(backend, rep, unsure):
        return
    if "anthropic" not in cands and await _instruct(backend, rep, unsure):
        return
    rep.error = (
        f"the LLM at {backend.base} took none of the continuation modes ({'; '.join(rep.tried)}): "
        "check the URL and model, or choose a mode with --llm-mode"
    )


def _by_shape(rep: ProbeReport, unsure: list[tuple[str, Wire, str]], picked: str) -> str:
    lead = (
        f"cannot tell whether {' / '.join(c for c, _, _ in unsure)} continued the trace ({unsure[0][2]})"
        if unsure
        else "no OpenAI-style continuation mode was shown to continue the trace"
    )
    return f"{lead}; picked by the provider's shape, Anthropic (saw: {'; '.join(rep.seen)}): {picked}"


def _settle(backend, rep: ProbeReport, wire: Wire, why: str) -> None:
    if rep.provider == "anthropic" and wire.mode != "anthropic":
        wire.dropped.add("top_p")  # Anthropic refuses it with temperature; the proxy passes both on
    backend.wire = wire
    rep.mode, rep.mode_reason = wire.describe(), why
    if rep.model_served is False:
        rep.model_served = True  # answered: the listing was incomplete
    rep.key = "accepted" if rep.key_sent else "none sent; none needed"


def _key_fix(rep: ProbeReport, status: int) -> str:
    if rep.key_sent:
        return (
            f"the LLM at {rep.url} rejected the API key from ${rep.key_env} (HTTP {status}): export the "
            "right key, or name its variable with api_key_env in the LLM spec"
        )
    return (
        f"the LLM at {rep.url} needs an API key (HTTP {status}): export {rep.key_env}, or name the key's "
        "variable with api_key_env in the LLM spec"
    )


def _unreachable_or_key(backend, rep: ProbeReport, e: BackendError) -> tuple[Wire | None, str, bool] | None:
    """`_try_mode`'s answer when the key was refused or the server never reached; None otherwise."""
    st = e.status
    if st in (401, 403):
        rep.key = f"rejected (HTTP {st})"
        rep.error = _key_fix(rep, st)
        return None, str(e), False
    if st is None and not e.reached_server:
        rep.error = f"cannot reach the LLM at {backend.base}: start the server or fix the URL in --llm"
        return None, str(e), False
    return None


def _refused_or_misnamed(
    backend, rep: ProbeReport, mode: str, optional: bool, st: int | None, msg: str, fields: set[str]
) -> tuple[Wire | None, str, bool] | None:
    """`_try_mode`'s answer for a route this server lacks, a wrong base URL or a model it does not serve; None
    when the refusal is none of these."""
    low = msg.lower()
    if (mode == "completion" or optional) and st is not None and st < 500:  # e.g. no such route here
        return None, f"HTTP {st}: {msg}", False
    if st == 404 and "model" not in low:
        rep.error = (
            f"the LLM URL {backend.base} answered 404 ({msg}): check that it ends in /v1 (or the API's base path)"
        )
        return None, msg, False
    named = str(backend.model).lower() in low or "pinned" in low
    if "model" in low and (st == 404 or (st == 400 and named)) and not fields - {"model"}:
        served = f"; it serves: {', '.join(rep.models_listed)}" if rep.models_listed else ""
        rep.model_served = False
        fix = f"use {backend.base}#{rep.models_listed[0]}" if rep.models_listed else "fix '#MODEL' in --llm"
        rep.error = f"the LLM at {backend.base} does not serve model {backend.model!r} (HTTP {st}{served}): {fix}"
        return None, msg, False
    return None


def _adapt_fields(wire: Wire, mode: str, st: int | None, fields: set[str]) -> bool:
    """Adapt `wire` to a refused field (`max_tokens` -> `max_completion_tokens`, or leave out an ADAPTABLE one);
    False when there is nothing left to adapt."""
    if "max_tokens" in fields and wire.max_tokens_field == "max_tokens" and mode not in ("completion", "anthropic"):
        wire.max_tokens_field = "max_completion_tokens"
        return True
    if st is not None and 400 <= st < 500 and fields and fields <= set(ADAPTABLE) and not (fields & wire.dropped):
        wire.dropped |= fields
        return True
    return False


def _after_refusal(
    backend, rep: ProbeReport, wire: Wire, mode: str, optional: bool, e: BackendError
) -> tuple[Wire | None, str, bool] | None:
    """None when `wire` was adapted to the refusal (send again); else `_try_mode`'s answer."""
    st = e.status
    _look(backend, rep, str(e))
    if (out := _unreachable_or_key(backend, rep, e)) is not None:
        return out
    msg = str(e).split(": ", 1)[-1][:160]
    fields = rejected_fields(e)
    if mode == "anthropic" and wire.prefill and "prefill" in msg.lower():
        wire.prefill = False
        return None
    if "top_p" in fields and st is not None and 400 <= st < 500 and "top_p" not in wire.dropped:
        wire.dropped.add("top_p")  # Anthropic's "temperature and top_p cannot both be specified"
        return None
    if (out := _refused_or_misnamed(backend, rep, mode, optional, st, msg, fields)) is not None:
        return out
    if _adapt_fields(wire, mode, st, fields):
        return None
    return None, (f"HTTP {st}: {msg}" if st else msg), False


async def _verify(backend, rep: ProbeReport, wire: Wire, fin: GenChunk) -> tuple[Wire, str, bool]:
    """An accepted mode: whether the prefix was shown continued (fewer prompt tokens than the same text sent as a
    closed turn)."""
    mode = wire.mode
    if mode == "instruct" or (mode == "anthropic" and not wire.prefill):
        return wire, "accepted", True
    if mode == "completion":
        return wire, "accepted (chat template rendered locally)", True
    if fin.usage_estimated:
        return wire, "accepted (not verified: no usage reported)", True
    if mode == "anthropic":
        return wire, "prefill accepted", True
    closed = GenRequest(messages=list(PROBE_MSGS) + [{"role": "assistant", "content": PROBE_PREFIX}], max_tokens=2)
    try:
        _, fin2 = await generate_with(backend, closed, Wire("instruct", wire.max_tokens_field, set(wire.dropped)))
    except BackendError:
        return wire, "accepted (not verified)", True
    _look(backend, rep)
    if fin2.usage_estimated or fin.prompt_tokens is None or fin2.prompt_tokens is None:
        return wire, "accepted (not verified: no usage reported)", True
    if fin.prompt_tokens < fin2.prompt_tokens:
        return wire, f"prefix continued ({fin.prompt_tokens} < {fin2.prompt_tokens} prompt tokens closed)", True
    why = (
        f"accepted, but {fin.prompt_tokens} prompt tokens, as many as the same text sent as a closed "
        f"turn ({fin2.prompt_tokens}): continued both times or the field ignored"
    )
    return wire, why, False


async def _try_mode(backend, mode: str, rep: ProbeReport, optional: bool = False) -> tuple[Wire | None, str, bool]:
    """(wire, why, shown): `wire` when the endpoint took the mode; `shown` False when it took it but the token
    counts could not show that the prefix was continued (see the module docstring). `optional`: a route the
    server may not have (the Messages API behind a proxy): any 4xx is a refusal, not a misconfiguration."""
    wire = Wire(mode)
    req = GenRequest(messages=list(PROBE_MSGS), prefix=PROBE_PREFIX if mode != "instruct" else "", max_tokens=2)
    for _ in range(6):
        try:
            _, fin = await generate_with(backend, req, wire)
        except BackendError as e:
            out = _after_refusal(backend, rep, wire, mode, optional, e)
            if out is None:
                continue
            return out
        _look(backend, rep)
        rep.usage_reported = not fin.usage_estimated
        return await _verify(backend, rep, wire, fin)
    return None, "refused after adapting the request", False


TOOL_PROBE = {
    "type": "function",
    "function": {
        "name": "echo",
        "description": "Repeat a word back.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
    },
}


async def probe_tools(backend, rep: ProbeReport) -> None:
    """Whether tool calls work in the mode found (`rep.tools`): one short request offering the `echo` function (a
    chat mode sends it as `tools`; completion mode renders it into the prompt with the local template), and what came
    back: structured calls, calls written as text (read by PyroDash's parser), no call, or a refusal."""
    if rep.mode is None or rep.error:
        return
    ask = [{"role": "user", "content": "Call the function echo with the word ok."}]
    try:
        text, fin = await generate_with(
            backend, GenRequest(messages=ask, max_tokens=64, tools=[TOOL_PROBE]), backend.wire
        )
    except (BackendError, ValueError) as e:
        why = f"HTTP {e.status}" if getattr(e, "status", None) else type(e).__name__
        rep.tools = f"no: the endpoint refused tools in mode {rep.mode} ({why}: {str(e)[:120]})"
        return
    if fin.tool_calls:
        rep.tools = f"yes: structured calls ({fin.tool_calls[0].name})"
    elif CALL_OPEN in text:
        rep.tools = "yes: calls written as text (<tool_call>), read by PyroDash's parser"
    else:
        rep.tools = "tools accepted, but the model wrote no call when asked (it may not call tools)"


def probe_llm(backend, tools: bool = False) -> ProbeReport:
    """Probe an `OpenAICompatBackend` (sets `backend.wire` when a mode is found); never raises for the endpoint's
    answers: what is wrong is in `.error`. `tools`: also try a tool call in the mode found (`probe_tools`; one more
    request, so `pyrodash check` asks for it and a server's start-up does not)."""
    ep = backend.endpoint
    rep = ProbeReport(
        url=backend.base,
        model=ep.model,
        configured_mode=ep.mode,
        key_env=ep.api_key_env,
        key_sent=bool(backend.api_key),
    )

    async def main() -> None:
        try:
            await _probe(backend, rep)
            if tools:
                await probe_tools(backend, rep)
        finally:
            await backend.aclose()

    run_sync(main())
    rep.error = backend.redact(rep.error) if rep.error else None
    rep.tried = [backend.redact(t) for t in rep.tried]
    return rep


# ---- reachability (/health) ----------------------------------------------------------------------------------


async def reachability(backend) -> dict:
    """Whether a backend answers (what `pyrodash serve`'s /health and an LLM mesh report): `backend.health()` within
    5 s when it has one (`ChecksHealth`: an HTTP endpoint lists its models, a mesh needs one member up); an
    in-process backend is up when it exists. A mesh adds its members' status."""
    if backend is None:
        return {"name": None, "reachable": False, "error": "no backend"}
    name = backend.name
    try:
        if isinstance(backend, ChecksHealth):
            await asyncio.wait_for(backend.health(), timeout=5)
        mesh = {"endpoints": backend.status()} if isinstance(backend, Meshed) else {}
        return {"name": name, "reachable": True, **mesh}
    except Exception as e:  # noqa: BLE001 - any failure means unreachable
        return {"name": name, "reachable": False, "error": f"{type(e).__name__}: {e}"}
