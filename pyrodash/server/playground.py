"""The browser playground of `pyrodash serve`: a page at `/` that streams answers with the SLM's and the LLM's text in
two colours, marks where `<offload>` fired, meters the cost against the LLM alone, and compares SLM only, LLM only
and PyroDash side by side ("SLM only": the base SLM when the server has one, else the served SLM with `<offload>`
banned; `pyrodash.answered_by` says which). Plain HTML/JS/CSS in `static/`; the page loads without a key and asks
the API with the client's key. docs/serving.md.

    GET /                    the page
    GET /static/{file}       its script and style sheet
    GET /playground/config   (auth) prices, operating points, token limits and modes the page shows
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from pyrodash.engine import MODES
from pyrodash.server.protocol import scrub

STATIC = Path(__file__).resolve().parent / "static"
NO_CACHE = {"Cache-Control": "no-cache"}  # a page from an older server version must not outlive an upgrade


def _short(backend) -> str | None:
    """A backend's display name without its directory or URL (the page needs no server paths)."""
    name = getattr(backend, "name", None)
    if not isinstance(name, str):
        return None
    return scrub(name.rstrip("/").rsplit("/", 1)[-1].split("#")[-1] or name)


def install(app: FastAPI, dependencies: list) -> None:
    """Add the playground's routes to `app`; `dependencies` guard `/playground/config` (the API's auth check)."""
    if not (STATIC / "index.html").exists():
        raise RuntimeError(f"the playground's files are missing from {STATIC}: reinstall pyrodash")
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", include_in_schema=False)
    async def page():
        return FileResponse(STATIC / "index.html", headers=NO_CACHE)

    @app.get("/playground/config", dependencies=dependencies, include_in_schema=False)
    async def playground_config():
        config = app.state.config
        engine = app.state.engine
        base = app.state.base_engine
        prices = getattr(engine, "prices", None) or config.load_prices()
        return {
            "prices_usd_per_million": prices.to_dict(),
            "operating_points": {name: asdict(p) for name, p in config.operating_points.items()},
            "default_model": config.default_model,
            "max_tokens": config.limits.max_tokens,
            "default_max_tokens": config.limits.default_max_tokens,
            "modes": list(MODES),
            "slm": _short(getattr(engine, "slm", None)),
            "llm": _short(getattr(engine, "llm", None)),
            # who answers "SLM only": the base SLM (by name) when the server has one, else the served SLM
            "base_slm": _short(base.slm) if base is not None else None,
            "slm_only": "base_slm" if base is not None else "slm",
            "handoff_style": getattr(engine, "handoff_style", config.handoff_style),
            "fallback": config.failure.on_error == "fallback",
        }
