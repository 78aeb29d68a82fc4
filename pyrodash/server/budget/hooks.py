"""The server's hooks into its budgets (`pyrodash.server.budget.budgets.Budgets`, on `app.state.budgets`): the
budgets installed with GET /v1/budget, the operating point a request gets before the engine runs (`pace`), the engine
that records a request's dollars on its budget (`metered`), the response's `budget` object (`with_budget`), /health's
field and the auth check's budget keys.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from fastapi import FastAPI, Request

from pyrodash.engine.requests import EngineRequest
from pyrodash.events import Done, LLMDelta
from pyrodash.server import errors, protocol
from pyrodash.server.budget.budgets import Budgets, Grant, LedgerUnavailable
from pyrodash.server.budget.reserve import LedgerError

log = logging.getLogger("pyrodash.serve")


def _registry(app: FastAPI):
    """The registry /metrics exports: the app's (`pyrodash.server.metrics.Metrics.registry`)."""
    return app.state.metrics.registry


def install(app: FastAPI, dependencies: list) -> None:
    """`app.state.budgets` from the config (None without a `budgets` section) and GET /v1/budget."""
    config = app.state.config
    cfg = getattr(config, "budgets", None)
    point = config.operating_points[config.default_model]
    app.state.budgets = Budgets(cfg, point.offload_bias, _registry(app)) if cfg is not None else None

    @app.get("/v1/budget", dependencies=dependencies)
    async def budget_state(request: Request):
        """The budgets' state: target, spend, the controller's knob, the cap; a budget key sees its own budget."""
        budgets: Budgets | None = app.state.budgets
        if budgets is None:
            return {"object": "budgets", "store": None, "data": []}
        only = budgets.key_budget(request)
        try:
            return await budgets.state(only)
        except LedgerError as e:
            err = LedgerUnavailable(only.name if only is not None else "*", e)
            return errors.error_response(request, err, err.headers)


async def pace(app: FastAPI, request: Request, call: EngineRequest) -> tuple[EngineRequest, Grant | None]:
    """Hook 1 (before the engine call): the request at the operating point its budget gives it, or a 429."""
    budgets: Budgets | None = getattr(app.state, "budgets", None)
    if budgets is None:
        return call, None
    return await budgets.pace(request, app.state.engine, call)


class _Metered:
    """An engine whose `stream` records the Done's dollars on the request's budget before handing the Done on."""

    def __init__(self, engine, budgets: Budgets, grant: Grant):
        self.engine, self.budgets, self.grant = engine, budgets, grant

    def __getattr__(self, name: str):
        return getattr(self.engine, name)

    async def _record(self, done: Done | None) -> None:
        try:  # shielded: a cancel arriving now does not leave the reservations to expire
            await asyncio.shield(self.budgets.record(self.grant, done))
        except Exception:  # noqa: BLE001 - the answer goes out whatever happens to its accounting
            log.exception("budget %s: recording a request's dollars failed", self.grant.budget.name)

    async def stream(self, prompt, **kwargs):
        self.grant.started = True
        inner = self.engine.stream(prompt, **kwargs)
        done = False
        gate = self.grant.gate
        try:
            async for ev in inner:
                if isinstance(ev, Done):
                    done = True
                    await self._record(ev)
                elif gate is not None and isinstance(ev, LLMDelta):
                    gate.streamed += len(ev.text.encode())
                yield ev
        except Exception as e:
            if not done and isinstance(getattr(e, "done", None), Done):  # EngineError: the failed request's record
                done = True
                await self._record(e.done)
            raise
        finally:
            await inner.aclose()  # the engine's own cleanup (upstream streams) runs now, not at garbage collection
            if not done:  # the client went or the engine failed: settled at the bound of what was made
                await self._record(None)


def metered(app: FastAPI, engine, grant: Grant | None):
    """Hook 2: the engine to run, recording the request's dollars on its budget (the engine itself without one).
    A request that ends without a Done (client gone) keeps the expected dollars it was charged, and its reservations
    on the cap settle at the bound of the calls it made (`Gate.cut_usd`)."""
    if grant is None:
        return engine
    return _Metered(engine, app.state.budgets, grant)


def with_budget(info_of: Callable[[Done], protocol.PyroDashInfo], grant: Grant | None):
    """The response's `pyrodash` object with `budget`: the budget drawn on and the operating point given."""
    if grant is None:
        return info_of

    def info(done: Done) -> protocol.PyroDashInfo:
        out = info_of(done)
        out.budget = grant.info
        return out

    return info


def health(app: FastAPI) -> dict:
    """/health's `budget` field ({} without budgets)."""
    budgets: Budgets | None = getattr(app.state, "budgets", None)
    return {"budget": budgets.health()} if budgets is not None else {}


def key_ok(request: Request) -> bool:
    """Whether the bearer key is one of the budgets' keys (the auth check accepts it)."""
    budgets: Budgets | None = getattr(request.app.state, "budgets", None)
    return budgets is not None and budgets.key_ok(request)


async def aclose(app: FastAPI) -> None:
    budgets: Budgets | None = getattr(app.state, "budgets", None)
    if budgets is not None:
        await budgets.aclose()
