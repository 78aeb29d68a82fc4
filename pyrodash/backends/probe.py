"""Start-up probes: which continuation mode an LLM endpoint takes, whether an SLM server stops at `<offload>`, and
whether a backend is reachable at all.

    rep = probe_llm(backend)      # ProbeReport: model served, key accepted, mode (detected / verified), usage
    rep = probe_slm(backend)      # SLMReport: <offload> id, stop_token_ids honoured, stop_reason reported
    print("\\n".join(rep.lines()))   # what `pyrodash check` prints
    status = await reachability(backend)   # {name, reachable, error?, endpoints?}: /health, an LLM mesh's health

The LLM probe sends a handful of 2-token requests. For mode auto it tries, in order: `continue` (vLLM/SGLang),
`completion` (when a local tokenizer renders the chat template), `prefix` (DeepSeek), `instruct` (any chat API);
an anthropic.com URL gets `anthropic`. A request the endpoint refuses for one field is adapted and sent again:
`max_tokens` -> `max_completion_tokens` (OpenAI reasoning models), and temperature / top_p / seed / stream_options
are left out when refused. A mode that continues a prefix must also show it: the continued request's prompt must be
shorter than the same text sent as a closed assistant turn (a server that silently ignores the extension field
counts both alike). 401/403 (key), a model the server does not serve and a mode that nothing accepts are
misconfigurations: `error` is one line that names the fix.
"""

from __future__ import annotations

import asyncio
import re
import threading
from dataclasses import dataclass, field
from urllib.parse import urlparse

import httpx

from pyrodash.backends.base import BackendError, GenChunk, GenRequest
from pyrodash.backends.continuation import Wire

PROBE_MSGS = [{"role": "user", "content": "Count on: 1, 2, 3"}]
PROBE_PREFIX = "1, 2, 3, 4"
ADAPTABLE = ("temperature", "top_p", "seed", "stream_options")
_FIELD_PATTERNS = (r"Unrecognized request argument supplied: (\w+)", r"Unsupported parameter: '(\w+)'",
                   r"'(\w+)' is not supported", r"Unexpected fields in the request: \{([^}]*)\}",
                   r"(\w+): Extra inputs are not permitted", r"unknown field[: ]+'?(\w+)")


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
    error: str | None = None

    def lines(self) -> list[str]:
        served = {True: "yes", False: "no", None: "unknown"}[self.model_served]
        listed = "" if self.models_listed is None else (
            f" (the server lists: {', '.join(self.models_listed[:8])})" if self.models_listed else
            " (the server lists none)")
        usage = {True: "yes", False: "no (counted locally or estimated, marked usage_estimated)",
                 None: "unknown"}[self.usage_reported]
        out = [f"LLM endpoint      {self.url}",
               f"  reachable       {'yes' if self.reachable else 'no'}",
               f"  model           {self.model or '?'}: served {served}{listed}",
               f"  API key         {self.key}",
               f"  mode            {self.mode or '-'}"
               + (f"  [{self.mode_reason}]" if self.mode_reason else "")
               + ("" if self.configured_mode == "auto" else f" (configured: {self.configured_mode})"),
               f"  usage reported  {usage}"]
        out += [f"  tried           {t}" for t in self.tried]
        if self.error:
            out.append(f"  ERROR           {self.error}")
        return out


async def _generate(backend, req: GenRequest, wire: Wire) -> tuple[str, GenChunk]:
    text, last = "", GenChunk()
    async for ch in backend.stream(req, wire=wire):
        text += ch.text
        if ch.finish_reason is not None:
            last = ch
    return text, last


async def _probe(backend, rep: ProbeReport) -> None:
    base = backend.base
    try:
        r = await backend.client().get(f"{base}/models", timeout=min(backend.timeout_s, 10))
    except httpx.HTTPError as e:
        rep.error = (f"cannot reach the LLM at {base} ({type(e).__name__}): start the server or fix the URL "
                     "in --llm")
        return
    rep.reachable = True
    if r.status_code in (401, 403):
        rep.key = f"rejected (HTTP {r.status_code})"
        rep.error = _key_fix(rep, r.status_code)
        return
    if r.status_code == 200:
        try:
            rep.models_listed = [str(m["id"]) for m in r.json().get("data", [])]
        except (ValueError, KeyError, TypeError, AttributeError):
            rep.models_listed = None
        if backend._model is None and rep.models_listed:
            backend._model = rep.models_listed[0]
        if rep.models_listed is not None and backend._model is not None:
            rep.model_served = backend._model in rep.models_listed
    if backend._model is None:
        rep.error = f"{base}/models names no model: add '#MODEL' to the --llm URL"
        return
    rep.model = backend._model
    mode = backend.endpoint.mode
    if mode == "auto":
        host = (urlparse(base).hostname or "").lower()
        cands = ["anthropic"] if host.endswith("anthropic.com") else (
            ["continue"] + (["completion"] if backend.local_tokenizer_dir() else []) + ["prefix", "instruct"])
    else:
        cands = [mode]
    for cand in cands:
        wire, why = await _try_mode(backend, cand, rep)
        if rep.error:
            return
        rep.tried.append(f"{cand}: {why}")
        if wire is not None:
            backend.wire = wire
            rep.mode, rep.mode_reason = wire.describe(), why
            if rep.model_served is False:
                rep.model_served = True  # answered: the listing was incomplete
            rep.key = "accepted" if rep.key_sent else "none sent; none needed"
            return
    if mode == "auto":
        rep.error = (f"the LLM at {base} took none of the continuation modes ({'; '.join(rep.tried)}): "
                     "check the URL and model, or choose a mode with --llm-mode")
    else:
        rep.error = (f"--llm-mode {mode}: the LLM at {base} refused it ({rep.tried[-1].split(': ', 1)[1]}); "
                     "use --llm-mode auto to detect a mode it takes")


def _key_fix(rep: ProbeReport, status: int) -> str:
    if rep.key_sent:
        return (f"the LLM at {rep.url} rejected the API key from ${rep.key_env} (HTTP {status}): export the "
                "right key, or name its variable with api_key_env in the LLM spec")
    return (f"the LLM at {rep.url} needs an API key (HTTP {status}): export {rep.key_env}, or name the key's "
            "variable with api_key_env in the LLM spec")


async def _try_mode(backend, mode: str, rep: ProbeReport) -> tuple[Wire | None, str]:
    wire = Wire(mode)
    cont = mode != "instruct"
    req = GenRequest(messages=list(PROBE_MSGS), prefix=PROBE_PREFIX if cont else "", max_tokens=2)
    for _ in range(6):
        try:
            _, fin = await _generate(backend, req, wire)
        except BackendError as e:
            st = e.status
            if st in (401, 403):
                rep.key = f"rejected (HTTP {st})"
                rep.error = _key_fix(rep, st)
                return None, str(e)
            if st is None and not e.reached_server:
                rep.error = f"cannot reach the LLM at {backend.base}: start the server or fix the URL in --llm"
                return None, str(e)
            msg = str(e).split(": ", 1)[-1][:160]
            low = msg.lower()
            if mode == "completion" and st is not None and st < 500:  # e.g. no /completions route for this model
                return None, f"HTTP {st}: {msg}"
            if st == 404 and "model" not in low:
                rep.error = (f"the LLM URL {backend.base} answered 404 ({msg}): check that it ends in /v1 (or the "
                             "API's base path)")
                return None, msg
            fields = rejected_fields(e)
            if mode == "anthropic" and wire.prefill and "prefill" in low:
                wire.prefill = False
                continue
            named = str(backend.model).lower() in low or "pinned" in low
            if "model" in low and (st == 404 or (st == 400 and named)) and not fields - {"model"}:
                served = f"; it serves: {', '.join(rep.models_listed)}" if rep.models_listed else ""
                rep.model_served = False
                fix = f"use {backend.base}#{rep.models_listed[0]}" if rep.models_listed else "fix '#MODEL' in --llm"
                rep.error = (f"the LLM at {backend.base} does not serve model {backend.model!r} (HTTP {st}{served}): "
                             f"{fix}")
                return None, msg
            if "max_tokens" in fields and wire.max_tokens_field == "max_tokens" and mode not in (
                    "completion", "anthropic"):
                wire.max_tokens_field = "max_completion_tokens"
                continue
            if st is not None and 400 <= st < 500 and fields and fields <= set(ADAPTABLE) and not (
                    fields & wire.dropped):
                wire.dropped |= fields
                continue
            return None, f"HTTP {st}: {msg}" if st else msg
        rep.usage_reported = not fin.usage_estimated
        if not cont or (mode == "anthropic" and not wire.prefill):
            return wire, "accepted"
        if mode == "completion":
            return wire, "accepted (chat template rendered locally)"
        if fin.usage_estimated:
            return wire, "accepted (not verified: no usage reported)"
        closed = GenRequest(messages=list(PROBE_MSGS) + [{"role": "assistant", "content": PROBE_PREFIX}],
                            max_tokens=2)
        if mode == "anthropic":
            return wire, "prefill accepted"
        try:
            _, fin2 = await _generate(backend, closed, Wire("instruct", wire.max_tokens_field, set(wire.dropped)))
        except BackendError:
            return wire, "accepted (not verified)"
        if fin2.usage_estimated or fin.prompt_tokens is None or fin2.prompt_tokens is None:
            return wire, "accepted (not verified: no usage reported)"
        if fin.prompt_tokens < fin2.prompt_tokens:
            return wire, f"prefix continued ({fin.prompt_tokens} < {fin2.prompt_tokens} prompt tokens closed)"
        return None, (f"accepted but the prefix was not continued ({fin.prompt_tokens} prompt tokens, as a closed "
                      "turn): the server ignores the field")
    return None, "refused after adapting the request"


def probe_llm(backend) -> ProbeReport:
    """Probe an `OpenAICompatBackend` (sets `backend.wire` when a mode is found); never raises for the endpoint's
    answers: what is wrong is in `.error`."""
    ep = backend.endpoint
    rep = ProbeReport(url=backend.base, model=ep.model, configured_mode=ep.mode, key_env=ep.api_key_env,
                      key_sent=bool(backend.api_key))

    async def main() -> None:
        try:
            await _probe(backend, rep)
        finally:
            await backend.aclose()

    run_sync(main())
    rep.error = backend.redact(rep.error) if rep.error else None
    rep.tried = [backend.redact(t) for t in rep.tried]
    return rep


# ---- the SLM side --------------------------------------------------------------------------------------------


@dataclass
class SLMReport:
    name: str
    offload_id: int | None = None
    stop_honoured: bool | None = None
    stop_reason_reported: bool | None = None
    plain_stop: str = ""
    error: str | None = None

    def lines(self) -> list[str]:
        yn = {True: "yes", False: "NO", None: "unknown"}
        out = [f"SLM               {self.name}",
               f"  <offload> id    {self.offload_id if self.offload_id is not None else 'none'}",
               f"  stop_token_ids honoured   {yn[self.stop_honoured]}",
               f"  stop_reason reported      {yn[self.stop_reason_reported]}"]
        if self.plain_stop:
            out.append(f"  a plain answer ended by   {self.plain_stop}")
        if self.error:
            out.append(f"  ERROR           {self.error}")
        return out


def probe_slm(backend, offload_token: str = "<offload>") -> SLMReport:
    """Check that the SLM stops at `<offload>` and says so: one request with `<offload>` pushed to the top
    (stop_token_ids + logit_bias) must stop after one token with `stop_reason` = its id and no text."""
    rep = SLMReport(name=getattr(backend, "name", str(backend)))
    try:
        rep.offload_id = backend.token_id(offload_token)
    except ValueError as e:
        rep.error = str(e)
        return rep
    if rep.offload_id is None:
        rep.error = (f"the SLM has no {offload_token} token in its vocabulary: run Stage 1 (pyrodash train stage1) "
                     "or pyrodash.tokens.add_offload_token first")
        return rep
    oid = rep.offload_id

    async def main() -> None:
        try:
            forced = GenRequest(messages=list(PROBE_MSGS), max_tokens=3, stop_token_ids=[oid],
                                logit_bias={oid: 100.0})
            text, fin = await _generate(backend, forced, Wire("continue")) if hasattr(backend, "wire") else \
                await _generate_any(backend, forced)
            rep.stop_honoured = fin.finish_reason == "stop" and offload_token not in text and not text.strip() and (
                fin.completion_tokens in (None, 1))
            rep.stop_reason_reported = fin.stop_token_id == oid
            plain = GenRequest(messages=list(PROBE_MSGS), max_tokens=8, stop_token_ids=[oid])
            _, pf = await _generate(backend, plain, Wire("continue")) if hasattr(backend, "wire") else \
                await _generate_any(backend, plain)
            which = ("<offload>" if pf.stop_token_id == oid else f"token id {pf.stop_token_id}"
                     if pf.stop_token_id is not None else "EOS / stop string (no stop token id)")
            rep.plain_stop = f"finish_reason={pf.finish_reason}, {which}" if pf.finish_reason == "stop" else \
                f"finish_reason={pf.finish_reason}"
        except BackendError as e:
            rep.error = f"the SLM failed its check request: {e}"
        finally:
            await backend.aclose()

    run_sync(main())
    if rep.error is None and not rep.stop_honoured:
        rep.error = (f"the SLM server does not stop at {offload_token} (stop_token_ids / logit_bias ignored): "
                     "serve the SLM with vLLM, SGLang or `pyrodash serve-model`, or load it in process")
    elif rep.error is None and not rep.stop_reason_reported:
        rep.error = ("the SLM server stops but reports no stop_reason, so a handoff cannot be told from an "
                     "answer: serve the SLM with vLLM or `pyrodash serve-model` (they report stop_reason)")
    return rep


async def _generate_any(backend, req: GenRequest) -> tuple[str, GenChunk]:
    text, last = "", GenChunk()
    async for ch in backend.stream(req):
        text += ch.text
        if ch.finish_reason is not None:
            last = ch
    return text, last


# ---- reachability (/health) ----------------------------------------------------------------------------------


async def reachability(backend) -> dict:
    """Whether a backend answers (what `pyrodash serve`'s /health and an LLM mesh report): `backend.health()` when it
    has one; an HTTP backend must list its models (GET <base>/models) within 5 s; an in-process backend is up when
    it exists."""
    if backend is None:
        return {"name": None, "reachable": False, "error": "no backend"}
    name = getattr(backend, "name", None)
    check = getattr(backend, "health", None)
    base = getattr(backend, "base", None)
    try:
        if check is not None:
            await asyncio.wait_for(check(), timeout=5)
        elif isinstance(base, str) and base.startswith(("http://", "https://")):
            async with httpx.AsyncClient(timeout=5, headers=getattr(backend, "headers", None) or {}) as client:
                r = await client.get(f"{base}/models")
            if r.status_code != 200:
                raise ConnectionError(f"GET {base}/models answered {r.status_code}")
        mesh = getattr(backend, "status", None)
        return {"name": name, "reachable": True, **({"endpoints": mesh()} if callable(mesh) else {})}
    except Exception as e:  # noqa: BLE001 - any failure means unreachable
        return {"name": name, "reachable": False, "error": f"{type(e).__name__}: {e}"}
