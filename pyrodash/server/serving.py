"""The serving objects behind the routes (as vLLM's `serving_chat`): `ServingCompletions` answers one wire API's
completion route (`pyrodash.server.front`: chat, text, OpenAI's Responses, Anthropic's Messages), one per route in
`app.state`.

    serving = ServingCompletions(app, front.CHAT)
    response = await serving.create(request)     # a JSONResponse, an SSEResponse, or an OpenAI error

A request is read and validated once into the engine's typed request (`pyrodash.engine.EngineRequest`,
`pyrodash.server.validation`), checked against the models' windows by the engine itself (`prepare`), paced by its
budget (`pyrodash.server.budget`), traced (`pyrodash.server.tracing`), and that one object is what the engine runs
(`EngineRun`, `engine.stream(request)`).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from pyrodash.engine import EngineRequest
from pyrodash.events import Done
from pyrodash.server import errors, estimates, protocol, validation
from pyrodash.server.budget import budgets, hooks
from pyrodash.server.engine_run import EngineRun, first_batch, gone, watch
from pyrodash.server.front import Front, sources
from pyrodash.server.metrics import Metrics
from pyrodash.server.sse import SSE_HEADERS, SSEResponse, sse_events

log = logging.getLogger("pyrodash.serve")


class ServingCompletions:
    """One completion route: `create(request)` validates, paces, traces and runs one request, and answers it as
    JSON or as server-sent events, in its front's wire API."""

    def __init__(self, app: FastAPI, front: Front) -> None:
        self.app, self.front, self.route, self.wire = app, front, front.route, front.wire
        self.metrics: Metrics = app.state.metrics

    async def create(self, request: Request):
        """The response to one completion request (a 4xx/5xx raised as `protocol.APIError` before the engine runs)."""
        req, call = await self._validated(request)
        try:  # the request's budget sets its operating point (pyrodash.server.budget.budgets); 429 at a hard cap,
            call, grant = await hooks.pace(self.app, request, call)  # 503 when its ledger cannot answer
        except (budgets.Refused, budgets.LedgerUnavailable) as e:
            return errors.error_response(request, e, e.headers)
        answered_by = call.mode
        if call.mode == "slm" and self.app.state.base_engine is not None:
            answered_by = "base_slm"  # the base SLM answers alone, to the end (the served SLM would stop early)
        info = hooks.with_budget(self._info_of(call, answered_by), grant)  # with the budget and point it got
        self.metrics.in_flight.inc()
        runner = self.app.state.base_engine if answered_by == "base_slm" else self.app.state.engine
        trace = self._trace(request, runner, call, bool(req.stream))
        run = EngineRun(
            hooks.metered(self.app, runner, grant),
            call,
            self.app.state.runs,
            self.app.state.sem,
            on_exit=self.metrics.in_flight.dec,
            clock=getattr(request.state, "clock", None),
            observe=trace.observe if trace is not None else None,
        )
        model = request.state.model
        if req.stream:
            return await self._stream(request, run, model, req, info)
        return await self._unary(request, run, model, req, info)

    async def _validated(self, request: Request):
        """(the wire request, the engine's request): read, parsed, the model and limits checked, and (in-process
        models) the prompts checked against their windows by the engine."""
        app, config = self.app, self.app.state.config
        raw = await validation.read_json(request, config.limits.max_body_bytes)
        req = validation.parse(self.wire, raw, allow_unknown=config.allow_unknown_fields)
        model, call = self.front.convert(app, req)
        request.state.model = model  # a validated name: the metrics' model label stays bounded
        request.state.counted = True  # from here the route (or the error handler) counts the response itself
        counts = getattr(app.state.engine, "counts_prompts", None)
        if callable(counts) and counts():  # models behind HTTP: nothing to count, and no thread round trip
            call = await validation.check_context(app, call, validation.budget_param(req))
        return req, call

    def _info_of(self, call: EngineRequest, answered_by: str) -> Callable[[Done], protocol.PyroDashInfo]:
        """The response's `pyrodash` object for the run's Done: the record, its cost split and the LLM-only
        estimate (at the served engine's prices)."""
        engine, rid = self.app.state.engine, uuid.uuid4().hex[:16]

        def info(done: Done) -> protocol.PyroDashInfo:
            for err in done.errors:  # the client gets reason codes; the full upstream text stays in this log
                log.warning("request %s: LLM failure: %s", rid, err)
            prices = getattr(engine, "prices", None)
            by = "llm" if done.routed else answered_by  # past the SLM's range (`routed`): the LLM answered alone
            if prices is None:
                return protocol.PyroDashInfo.from_done(done, call.mode, answered_by=by, request_id=rid)
            solo = done if by == "slm" else None  # (the engine's own SLM answered alone)
            llm_only = engine.llm_only_prompt(call, solo) if by != "llm" else None
            return protocol.PyroDashInfo.from_done(
                done,
                call.mode,
                estimates.llm_only_estimate(done, prices, llm_only, "llm" if by == "llm" else call.mode),
                answered_by=by,
                request_id=rid,
            )

        return info

    def _trace(self, request: Request, runner, call: EngineRequest, stream: bool):
        """The request's trace (`app.state.tracing`, `--otlp-endpoint`), or None without tracing."""
        if self.app.state.tracing is None:
            return None
        clock = getattr(request.state, "clock", None)
        trace = request.state.trace = self.app.state.tracing.request(
            f"POST {self.route}",
            request.scope["headers"],
            clock.t0 if clock else time.perf_counter(),
            getattr(runner, "prices", None),
            {
                "http.request.method": "POST",
                "http.route": self.route,
                "gen_ai.request.model": request.state.model,
                "gen_ai.operation.name": self.front.operation,
                "pyrodash.mode": call.mode,
                "pyrodash.stream": stream,
            },
        )
        return trace

    def _gone(self, model: str) -> JSONResponse:
        """The client went away before its answer: counted, and a 499."""
        self.metrics.errors.inc(kind="disconnect")
        self.metrics.requests.inc(route=self.route, model=model, status="499")
        body = self.front.error_body(protocol.APIError(499, "client closed request", code="client_closed"))
        return errors.ErrorResponse(body, status_code=499)  # (not raised: counted here already)

    async def _stream(self, request: Request, run: EngineRun, model: str, req, info):
        """Server-sent events; the status line waits for the engine's first events, so an error before any output is
        a real 4xx/5xx."""
        watcher, first = await first_batch(request, run)
        if watcher is None:
            return self._gone(model)
        writer = self.front.writer(model, req)
        body = sse_events(self.metrics, run, first, writer, model, self.route, info, sources(req))
        return SSEResponse(body, run, watcher, headers=SSE_HEADERS)

    async def _unary(self, request: Request, run: EngineRun, model: str, req, info_of) -> JSONResponse:
        """One JSON completion once the run is done (the client going away cancels the run: a 499)."""
        watcher = watch(request, run)
        done: Done | None = None
        try:
            done = await run.done()
        except Exception as e:  # noqa: BLE001 - mapped to an OpenAI error (counted by its handler)
            if not gone(watcher):
                raise errors.failure(e) from e
        finally:
            watcher.cancel()
            run.cancel()
        if done is None:
            return self._gone(model)
        self.metrics.requests.inc(route=self.route, model=model, status="200")
        out = self.front.body(done, model, info_of(done), req)
        overhead = run.clock.overhead_s()
        out["pyrodash"]["overhead_ms"] = round(overhead * 1e3, 3)
        self.metrics.observe_done(done, model, run.elapsed, run.ttft, overhead)
        return JSONResponse(out)
