"""OpenTelemetry traces of `pyrodash serve`: a span per request, child spans for the SLM, the handoff and each LLM.

    pip install 'pyrodash[otel]'
    pyrodash serve ... --otlp-endpoint http://collector:4318          # OTLP over HTTP (/v1/traces is appended)
    app.state.tracing = Tracing(provider)                               # any TracerProvider (what `setup(url)` makes)

A request span `POST /v1/chat/completions` (continuing a W3C `traceparent`) has children `slm.decode`, `handoff`,
one `llm.call` per endpoint that wrote text, and `slm.fallback`, timed from the engine's events as the server reads
them (the engine imports no OpenTelemetry); it carries the tokens, dollars, handoff, status and overhead. Spans are
built after the response's last byte, so tracing adds nothing to a response's latency. Span by span: docs/serving.md.
"""

from __future__ import annotations

import time
from urllib.parse import urlsplit

from pyrodash.events import Done, Handoff, LLMDelta, SLMDelta

SERVICE_NAME = "pyrodash"


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of a collector address: `/v1/traces` is appended to a URL without a path."""
    u = urlsplit(endpoint)
    if u.scheme not in ("http", "https") or not u.netloc:
        raise ValueError(
            f"--otlp-endpoint {endpoint!r}: give the collector's OTLP/HTTP URL, e.g. "
            "http://127.0.0.1:4318 (or .../v1/traces)"
        )
    return endpoint.rstrip("/") + "/v1/traces" if u.path in ("", "/") else endpoint


def setup(endpoint: str, service_name: str = SERVICE_NAME) -> Tracing:
    """A `Tracing` that exports to an OTLP/HTTP collector in batches (a background thread of the SDK)."""
    url = traces_url(endpoint)
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as e:
        raise ValueError(
            f"--otlp-endpoint needs OpenTelemetry's SDK and OTLP exporter: pip install 'pyrodash[otel]' ({e})"
        ) from None
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
    return Tracing(provider)


class Tracing:
    """Builds the spans of the server's requests with `provider`'s tracer."""

    def __init__(self, provider) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.tracer = provider.get_tracer("pyrodash.server")
        self._propagator = TraceContextTextMapPropagator()

    def request(
        self, name: str, headers: list[tuple[bytes, bytes]], t0: float, prices=None, attributes: dict | None = None
    ) -> RequestTrace:
        """The trace of one request that arrived at `t0` (`time.perf_counter()`), child of the caller's
        `traceparent` when it sent one."""
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in headers if k in (b"traceparent", b"tracestate")}
        parent = self._propagator.extract(carrier) if carrier else None
        return RequestTrace(self.tracer, name, t0, parent, prices, attributes or {})

    def flush(self) -> None:
        flush = getattr(self.provider, "force_flush", None)
        if callable(flush):
            flush()

    def shutdown(self) -> None:
        stop = getattr(self.provider, "shutdown", None)
        if callable(stop):
            stop()


class RequestTrace:
    """What the spans of one request need: event times (perf_counter seconds) and the final `Done`. `observe` is
    called for every engine event (None: the engine started), `end` once the response is over."""

    def __init__(self, tracer, name: str, t0: float, parent, prices, attributes: dict) -> None:
        self.tracer, self.name, self.t0, self.parent, self.prices = tracer, name, t0, parent, prices
        self.attributes = dict(attributes)
        self._epoch = time.time_ns() - time.perf_counter_ns()  # perf_counter seconds -> epoch nanoseconds
        self.started: float | None = None  # the engine's start
        self.handoff: Handoff | None = None
        self.t_handoff: float | None = None
        self.llm: list[tuple[float, int]] = []  # (time, characters of LLM text so far) per LLM delta
        self.llm_chars = 0
        self.t_fallback: float | None = None  # the first SLM text after the LLM phase
        self.t_last: float | None = None  # the last event
        self.done: Done | None = None
        self.ended = False

    def ns(self, t: float) -> int:
        return self._epoch + int(t * 1e9)

    def observe(self, ev, t: float) -> None:
        if ev is None:
            self.started = t
            return
        self.t_last = t
        if isinstance(ev, SLMDelta):
            if (self.handoff is not None or self.llm) and self.t_fallback is None:
                self.t_fallback = t
        elif isinstance(ev, LLMDelta):
            self.llm_chars += len(ev.text)
            self.llm.append((t, self.llm_chars))
        elif isinstance(ev, Handoff):
            self.handoff, self.t_handoff = ev, t
        elif isinstance(ev, Done):
            self.done = ev

    # ---- the spans, once the response is over --------------------------------------------------------------
    def end(self, status: int, t_end: float | None = None, overhead_ms: float | None = None) -> None:
        if self.ended:
            return
        self.ended = True
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind, Status, StatusCode

        t_end = time.perf_counter() if t_end is None else t_end
        attrs = {**self.attributes, "http.response.status_code": status}
        if overhead_ms is not None:
            attrs["pyrodash.overhead_ms"] = round(overhead_ms, 3)
        root = self.tracer.start_span(
            self.name, context=self.parent, kind=SpanKind.SERVER, start_time=self.ns(self.t0), attributes=attrs
        )
        ctx = trace.set_span_in_context(root)
        done = self.done
        if done is not None:
            root.set_attributes(self._totals(done))
            for err in done.errors:
                root.add_event("llm.error", {"pyrodash.error": err[:500]})
        if status >= 500 or (done is None and status >= 400):
            root.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
        self._children(ctx, done, t_end)
        root.end(end_time=self.ns(t_end))

    def _span(self, ctx, name: str, start: float, end: float, attrs: dict, error: str | None = None) -> None:
        from opentelemetry.trace import Status, StatusCode

        span = self.tracer.start_span(name, context=ctx, start_time=self.ns(start), attributes=attrs)
        if error:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=self.ns(max(start, end)))

    def _children(self, ctx, done: Done | None, t_end: float) -> None:
        start = self.started if self.started is not None else self.t0
        last = self.t_last if self.t_last is not None else t_end
        mode = done.mode if done is not None else ("llm" if self.llm and self.t_handoff is None else "collab")
        u = done.usage if done is not None else None
        costs = self._costs(done)
        if mode != "llm":  # the SLM decodes first (collab, or alone)
            end = self.t_handoff if self.t_handoff is not None else last
            attrs = {}
            if u is not None:
                attrs = {
                    "gen_ai.usage.input_tokens": u.slm_in,
                    "gen_ai.usage.output_tokens": u.slm_out,
                    "pyrodash.cost_usd": costs.get("slm_in", 0.0) + costs.get("slm_out", 0.0),
                }
            self._span(ctx, "slm.decode", start, end, attrs)
        if self.handoff is not None:
            first_llm = self.llm[0][0] if self.llm else (self.t_fallback or last)
            self._span(
                ctx,
                "handoff",
                self.t_handoff,
                first_llm,
                {
                    "pyrodash.handoff.slm_tokens": self.handoff.slm_tokens,
                    "pyrodash.handoff.packed_chars": len(self.handoff.packed),
                },
            )
        if mode != "slm":
            self._llm_calls(ctx, done, self.t_handoff if self.t_handoff is not None else start, last)
        if self.t_fallback is not None:
            self._span(ctx, "slm.fallback", self.t_fallback, last, {"pyrodash.fallback": True})

    def _llm_calls(self, ctx, done: Done | None, t_start: float, last: float) -> None:
        """One span per LLM endpoint that wrote text, timed by the characters it wrote (`Done.segments` in order),
        then a zero-length one per endpoint that only failed."""
        entries = {e["endpoint"]: e for e in (done.llm_endpoints if done is not None else [])}
        segs = [s for s in (done.segments if done is not None else []) if s.get("by") == "llm"]
        if not segs and self.llm:  # no record (the request ended early): one span over the LLM text seen
            segs = [{"endpoint": None, "text": "x" * self.llm_chars}]
        seen, pos, t_prev, i = set(), 0, t_start, 0
        for seg in segs:  # each from the end of the one before (the first from the handoff) to its last token
            start = t_prev
            pos += len(seg["text"])
            while i < len(self.llm) and self.llm[i][1] <= pos:
                t_prev = self.llm[i][0]
                i += 1
            ep = seg.get("endpoint")
            self._span(ctx, "llm.call", start, t_prev, self._endpoint_attrs(entries.get(ep), ep))
            seen.add(ep)
        for ep, e in entries.items():
            if ep not in seen:  # reached, but wrote nothing (failed before its first token)
                self._span(
                    ctx,
                    "llm.call",
                    t_start,
                    t_start,
                    self._endpoint_attrs(e, ep),
                    error="no text" if e.get("errors") else None,
                )
        if done is not None and not segs and not entries and done.usage.llm_calls:
            self._span(
                ctx,
                "llm.call",
                t_start,
                last,
                {"pyrodash.llm.calls": done.usage.llm_calls},
                error="failed" if done.errors else None,
            )

    @staticmethod
    def _endpoint_attrs(e: dict | None, name: str | None) -> dict:
        attrs = {"pyrodash.llm.endpoint": name} if name else {}
        if e:
            attrs.update(
                {
                    "pyrodash.llm.calls": e.get("calls", 0),
                    "gen_ai.usage.input_tokens": e.get("llm_in", 0),
                    "gen_ai.usage.output_tokens": e.get("llm_out", 0),
                    "pyrodash.tokens.llm_cached_in": e.get("llm_cached_in", 0),
                    "pyrodash.cost_usd": float(e.get("cost_usd", 0.0)),
                    "pyrodash.llm.errors": e.get("errors", 0),
                }
            )
        return attrs

    def _costs(self, done: Done | None) -> dict[str, float]:
        if done is None or self.prices is None:
            return {}
        return dict(done.cost_usd_by_component)

    def _totals(self, done: Done) -> dict:
        u = done.usage
        out = {
            f"pyrodash.tokens.{c}": getattr(u, c) for c in ("slm_in", "slm_out", "llm_in", "llm_out", "llm_cached_in")
        }
        out.update(
            {
                "pyrodash.cost_usd": float(done.cost_usd),
                "pyrodash.llm_calls": u.llm_calls,
                "pyrodash.handoff": done.handoff if done.handoff is not None else -1,
                "pyrodash.fallback": done.fallback,
                "pyrodash.finish_reason": done.finish_reason,
                "pyrodash.mode": done.mode,
                "gen_ai.usage.input_tokens": u.slm_in + u.llm_in,
                "gen_ai.usage.output_tokens": u.slm_out + u.llm_out,
            }
        )
        for comp, usd in self._costs(done).items():
            out[f"pyrodash.cost_usd.{comp}"] = float(usd)
        return out
