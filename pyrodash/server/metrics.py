"""Prometheus metrics of `pyrodash serve`, kept with `prometheus_client`.

    m = Metrics()
    m.observe_done(done, model="pyrodash", latency_s=0.8, ttft_s=0.05)
    text = m.render()        # what GET /metrics returns (text exposition format 0.0.4)

Counters (requests, handoffs, fallbacks, errors, tokens, dollars, LLM calls, per mesh endpoint), histograms (latency,
time to first token, `pyrodash_overhead_seconds`) and the in-flight gauge. One process: each `Metrics` has its own
registry, rendered with prometheus_client's default one. `--workers N`: every worker writes to
$PROMETHEUS_MULTIPROC_DIR and `render()` sums them (`MultiProcessCollector`); a stopping worker calls
`mark_process_dead()`. The series and what they mean: docs/serving.md, docs/scaling.md.
"""

from __future__ import annotations

import os

import prometheus_client as pc
from prometheus_client import CollectorRegistry, generate_latest

from pyrodash.events import Done

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
OVERHEAD_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

pc.disable_created_metrics()  # no `_created` series: the exposition stays what it was (and half the size)


def multiprocess() -> bool:
    """Whether metrics live in PROMETHEUS_MULTIPROC_DIR (several worker processes)."""
    return bool(os.environ.get(MULTIPROC_ENV))


class _Metric:
    """A prometheus_client metric called the way the server calls it: `inc(amount, **labels)`, `observe(v, **labels)`
    (the label names are declared up front; every call gives all of them, or none for an unlabelled metric)."""

    def __init__(self, cls, name: str, help: str, labels: tuple[str, ...], registry, **kw):
        self.name = name
        self.metric = cls(name, help, labelnames=labels, registry=registry, **kw)
        self._children: dict[tuple, object] = {}  # labels -> prometheus_client's child (its `labels()` is slow)

    def _child(self, labels: dict):
        if not labels:
            return self.metric
        key = tuple(labels.items())
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self.metric.labels(**labels)
        return child

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        self._child(labels).inc(amount)

    def _sample(self, suffix: str, labels: dict) -> float:
        for fam in self.metric.collect():
            for s in fam.samples:
                if s.name == fam.name + suffix and s.labels == {k: str(v) for k, v in labels.items()}:
                    return s.value
        return 0.0


class Counter(_Metric):
    def __init__(self, name: str, help: str, labels: tuple[str, ...], registry) -> None:
        super().__init__(pc.Counter, name, help, labels, registry)

    def get(self, **labels: str) -> float:
        return self._sample("_total", labels)


class Gauge(_Metric):
    def __init__(self, name: str, help: str, labels: tuple[str, ...], registry, mode: str = "livesum") -> None:
        super().__init__(pc.Gauge, name, help, labels, registry, multiprocess_mode=mode)

    def dec(self, amount: float = 1.0, **labels: str) -> None:
        self._child(labels).dec(amount)

    def get(self, **labels: str) -> float:
        return self._sample("", labels)


class Histogram(_Metric):
    def __init__(
        self, name: str, help: str, labels: tuple[str, ...], registry, buckets: tuple[float, ...] = LATENCY_BUCKETS
    ) -> None:
        super().__init__(pc.Histogram, name, help, labels, registry, buckets=buckets)

    def observe(self, value: float, **labels: str) -> None:
        self._child(labels).observe(value)

    def count(self, **labels: str) -> int:
        return int(self._sample("_count", labels))


class Metrics:
    """The server's metrics; `render()` is the /metrics body."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry if registry is not None else CollectorRegistry(auto_describe=True)
        model, endpoint = ("model",), ("endpoint",)
        self.requests = Counter(
            "pyrodash_requests_total", "HTTP requests by route, model and status code.", ("route", "model", "status"), r
        )
        self.in_flight = Gauge("pyrodash_requests_in_flight", "Engine requests running now.", (), r)
        self.handoffs = Counter("pyrodash_handoffs_total", "Requests in which the SLM handed off to the LLM.", model, r)
        self.fallbacks = Counter(
            "pyrodash_fallbacks_total", "Requests finished by the SLM after the LLM failed.", model, r
        )
        self.llm_errors = Counter(
            "pyrodash_llm_errors_total", "Failed LLM attempts (retried, or then a fallback).", model, r
        )
        self.outside_share = Counter(
            "pyrodash_outside_handoff_share_total",
            "Requests outside their operating point's handoff_share (the SLM answered alone).",
            model,
            r,
        )
        self.range_routed = Counter(
            "pyrodash_range_routed_total",
            "Requests past the SLM's range (the operating point's range rule): the LLM answered alone.",
            model,
            r,
        )
        self.relay_fallbacks = Counter(
            "pyrodash_relay_fallbacks_total",
            "Relay answers (max_llm_calls > 1) that became a single handoff part-way, by reason (stop_ignored: "
            "the LLM wrote past the step's stop sequence; step_cap: it reached the step's token cap; empty_step: "
            "it stopped before writing anything).",
            ("model", "reason"),
            r,
        )
        self.usage_estimated = Counter(
            "pyrodash_usage_estimated_total",
            "Requests with token counts a server did not report (counted or estimated).",
            model,
            r,
        )
        self.errors = Counter(
            "pyrodash_errors_total", "Failed requests by kind (client, upstream, disconnect).", ("kind",), r
        )
        self.tool_calls = Counter(
            "pyrodash_tool_calls_total", "Tool calls in answers, by the model that wrote them (slm, llm).", ("by",), r
        )
        self.tool_call_errors = Counter(
            "pyrodash_tool_call_errors_total",
            "Text a model wrote as a tool call that could not be read as one (dropped from the answer).",
            model,
            r,
        )
        self._declare_usage(r, model, endpoint)

    def _declare_usage(self, r: CollectorRegistry, model: tuple[str, ...], endpoint: tuple[str, ...]) -> None:
        """The tokens, dollars, timings and trimming of answered requests, in total and per LLM endpoint."""
        self.tokens = Counter(
            "pyrodash_tokens_total",
            "Tokens by component (slm_in ... llm_cached_in; slm_cached_in: of slm_in, served from the SLM's prefix "
            "cache, not billed).",
            ("component",),
            r,
        )
        self.llm_calls = Counter("pyrodash_llm_calls_total", "LLM requests made (retries included).", model, r)
        self.cost = Counter("pyrodash_cost_usd_total", "Dollars spent, priced with the server's price sheet.", model, r)
        self.latency = Histogram("pyrodash_request_duration_seconds", "Time from request to last byte.", model, r)
        self.ttft = Histogram(
            "pyrodash_time_to_first_token_seconds", "Time from request to first content token.", model, r
        )
        self.overhead = Histogram(
            "pyrodash_overhead_seconds",
            "Time a request spent in PyroDash itself: its wall "
            "time less the time the engine waited for the models (x-pyrodash-overhead-ms).",
            model,
            r,
            buckets=OVERHEAD_BUCKETS,
        )
        self.trimmed = Counter(
            "pyrodash_history_trimmed_messages_total",
            "Earlier conversation messages dropped to fit a model's context window, by side.",
            ("side",),
            r,
        )
        self.trimmed_requests = Counter(
            "pyrodash_history_trimmed_requests_total",
            "Requests whose history was trimmed for a model, by side.",
            ("side",),
            r,
        )
        self.ep_tokens = Counter(
            "pyrodash_llm_endpoint_tokens_total",
            "LLM tokens billed per endpoint and component.",
            ("endpoint", "component"),
            r,
        )
        self.ep_calls = Counter(
            "pyrodash_llm_endpoint_calls_total", "LLM calls that reached each endpoint.", endpoint, r
        )
        self.ep_errors = Counter(
            "pyrodash_llm_endpoint_errors_total", "LLM calls that failed, per endpoint.", endpoint, r
        )
        self.ep_cost = Counter(
            "pyrodash_llm_endpoint_cost_usd_total", "Dollars per LLM endpoint, at its own prices.", endpoint, r
        )
        self.ep_client_stops = Counter(
            "pyrodash_llm_endpoint_client_stops_total",
            "LLM calls the client closed at a stop string the endpoint wrote past (it ignores stop), per endpoint.",
            endpoint,
            r,
        )

    def observe_done(
        self, done: Done, model: str, latency_s: float, ttft_s: float | None, overhead_s: float | None = None
    ) -> None:
        u = done.usage
        for comp in ("slm_in", "slm_out", "llm_in", "llm_out", "llm_cached_in", "slm_cached_in"):
            self.tokens.inc(getattr(u, comp), component=comp)
        self.llm_calls.inc(u.llm_calls, model=model)
        self.cost.inc(done.cost_usd, model=model)
        if done.handoff is not None:
            self.handoffs.inc(model=model)
        if not done.handoff_admitted:
            self.outside_share.inc(model=model)
        if done.routed == "range":
            self.range_routed.inc(model=model)
        if done.fallback:
            self.fallbacks.inc(model=model)
        if done.relay_fallback:
            self.relay_fallbacks.inc(model=model, reason=done.relay_fallback)
        if done.errors:
            self.llm_errors.inc(len(done.errors), model=model)
        if done.usage_estimated:
            self.usage_estimated.inc(model=model)
        for call in done.tool_calls:
            self.tool_calls.inc(by=call.by or "unknown")
        if done.tool_call_errors:
            self.tool_call_errors.inc(len(done.tool_call_errors), model=model)
        for side, n in (done.trimmed or {}).items():
            if n:
                self.trimmed.inc(n, side=side)
                self.trimmed_requests.inc(side=side)
        for e in done.llm_endpoints:
            for comp in ("llm_in", "llm_out", "llm_cached_in"):
                self.ep_tokens.inc(e[comp], endpoint=e["endpoint"], component=comp)
            self.ep_calls.inc(e["calls"], endpoint=e["endpoint"])
            self.ep_errors.inc(e.get("errors", 0), endpoint=e["endpoint"])
            self.ep_cost.inc(e["cost_usd"], endpoint=e["endpoint"])
            self.ep_client_stops.inc(e.get("client_stops", 0), endpoint=e["endpoint"])
        self.latency.observe(latency_s, model=model)
        if ttft_s is not None:
            self.ttft.observe(ttft_s, model=model)
        if overhead_s is not None:
            self.overhead.observe(max(0.0, overhead_s), model=model)

    def render(self) -> str:
        """The exposition: this app's metrics and the default registry's, or every worker's (multiprocess)."""
        if multiprocess():
            from prometheus_client.multiprocess import MultiProcessCollector

            registry = CollectorRegistry()
            MultiProcessCollector(registry)
            return generate_latest(registry).decode()
        return (generate_latest(self.registry) + generate_latest(pc.REGISTRY)).decode()


def mark_process_dead(pid: int | None = None) -> None:
    """A worker that stops: its live gauges (requests in flight) leave the sum (multiprocess mode only)."""
    if multiprocess():
        from prometheus_client import multiprocess as mp

        mp.mark_process_dead(os.getpid() if pid is None else pid)
