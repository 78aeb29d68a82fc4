"""The SLM's start-up check: does its server stop at `<offload>` and say so (`stop_reason` = the token's id)?

rep = probe_slm(backend)      # SLMReport: <offload> id, stop_token_ids honoured, stop_reason reported
print("\\n".join(rep.lines()))   # what `pyrodash check` prints
"""

from __future__ import annotations

from dataclasses import dataclass

from pyrodash.backends.base import BackendError, GenChunk, GenRequest
from pyrodash.backends.http.continuation import Wire
from pyrodash.backends.http.probe import PROBE_MSGS, generate_with, run_sync


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
        out = [
            f"SLM               {self.name}",
            f"  <offload> id    {self.offload_id if self.offload_id is not None else 'none'}",
            f"  stop_token_ids honoured   {yn[self.stop_honoured]}",
            f"  stop_reason reported      {yn[self.stop_reason_reported]}",
        ]
        if self.plain_stop:
            out.append(f"  a plain answer ended by   {self.plain_stop}")
        if self.error:
            out.append(f"  ERROR           {self.error}")
        return out


async def _generate_any(backend, req: GenRequest) -> tuple[str, GenChunk]:
    text, last = "", GenChunk()
    async for ch in backend.stream(req):
        text += ch.text
        if ch.finish_reason is not None:
            last = ch
    return text, last


async def _send(backend, req: GenRequest) -> tuple[str, GenChunk]:
    """(text, last chunk): an HTTP backend continues nothing (`Wire("continue")`); others stream as they do."""
    if hasattr(backend, "wire"):
        return await generate_with(backend, req, Wire("continue"))
    return await _generate_any(backend, req)


async def _check_stops(backend, rep: SLMReport, oid: int, offload_token: str) -> None:
    """A request with `<offload>` pushed to the top must stop after one token, with no text and `stop_reason` = its
    id; a plain one says how an answer ends."""
    try:
        forced = GenRequest(messages=list(PROBE_MSGS), max_tokens=3, stop_token_ids=[oid], logit_bias={oid: 100.0})
        text, fin = await _send(backend, forced)
        rep.stop_honoured = (
            fin.finish_reason == "stop"
            and offload_token not in text
            and not text.strip()
            and (fin.completion_tokens in (None, 1))
        )
        rep.stop_reason_reported = fin.stop_token_id == oid
        _, pf = await _send(backend, GenRequest(messages=list(PROBE_MSGS), max_tokens=8, stop_token_ids=[oid]))
        which = (
            "<offload>"
            if pf.stop_token_id == oid
            else f"token id {pf.stop_token_id}"
            if pf.stop_token_id is not None
            else "EOS / stop string (no stop token id)"
        )
        rep.plain_stop = (
            f"finish_reason={pf.finish_reason}, {which}"
            if pf.finish_reason == "stop"
            else f"finish_reason={pf.finish_reason}"
        )
    except BackendError as e:
        rep.error = f"the SLM failed its check request: {e}"
    finally:
        await backend.aclose()


def probe_slm(backend, offload_token: str = "<offload>") -> SLMReport:
    """Check that the SLM stops at `<offload>` and says so: one request with `<offload>` pushed to the top
    (stop_token_ids + logit_bias) must stop after one token with `stop_reason` = its id and no text."""
    rep = SLMReport(name=backend.name)
    try:
        rep.offload_id = backend.token_id(offload_token)
    except ValueError as e:
        rep.error = str(e)
        return rep
    if rep.offload_id is None:
        rep.error = (
            f"the SLM has no {offload_token} token in its vocabulary: run Stage 1 (pyrodash train stage1) "
            "or pyrodash.tokens.add_offload_token first"
        )
        return rep
    run_sync(_check_stops(backend, rep, rep.offload_id, offload_token))
    if rep.error is None and not rep.stop_honoured:
        rep.error = (
            f"the SLM server does not stop at {offload_token} (stop_token_ids / logit_bias ignored): "
            "serve the SLM with vLLM, SGLang or `pyrodash serve-model`, or load it in process"
        )
    elif rep.error is None and not rep.stop_reason_reported:
        rep.error = (
            "the SLM server stops but reports no stop_reason, so a handoff cannot be told from an "
            "answer: serve the SLM with vLLM or `pyrodash serve-model` (they report stop_reason)"
        )
    return rep
