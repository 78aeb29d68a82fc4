"""Prometheus metrics of `pyrodash serve`, in the text exposition format (version 0.0.4), without dependencies.

    m = Metrics()
    m.observe_done(done, model="pyrodash", latency_s=0.8, ttft_s=0.05)
    text = m.render()        # what GET /metrics returns

Counters: requests (by route, model, status), handoffs, fallbacks, errors (by kind), tokens per billed component,
dollars. Histograms: request latency and time to first token. Gauge: requests in flight. One instance per app
(`app.state.metrics`); all updates happen on the event loop thread, so no locks are needed.
"""

from __future__ import annotations

import math
from collections import defaultdict

from pyrodash.events import Done

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
Labels = tuple[tuple[str, str], ...]


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    esc = (v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"') for _, v in labels)
    return "{" + ",".join(f'{k}="{v}"' for (k, _), v in zip(labels, esc)) + "}"


def _num(x: float) -> str:
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return repr(float(x)) if not float(x).is_integer() else str(int(x))


class Counter:
    kind = "counter"

    def __init__(self, name: str, help: str):
        self.name, self.help = name, help
        self.values: dict[Labels, float] = defaultdict(float)

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError(f"{self.name}: a counter only goes up (got {amount})")
        self.values[tuple(sorted(labels.items()))] += amount

    def get(self, **labels: str) -> float:
        return self.values.get(tuple(sorted(labels.items())), 0.0)

    def lines(self) -> list[str]:
        return [f"{self.name}{_labels(k)} {_num(v)}" for k, v in sorted(self.values.items())]


class Gauge(Counter):
    kind = "gauge"

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        self.values[tuple(sorted(labels.items()))] += amount

    def dec(self, amount: float = 1.0, **labels: str) -> None:
        self.inc(-amount, **labels)


class Histogram:
    kind = "histogram"

    def __init__(self, name: str, help: str, buckets: tuple[float, ...] = LATENCY_BUCKETS):
        self.name, self.help, self.buckets = name, help, tuple(sorted(buckets))
        self.counts: dict[Labels, list[int]] = {}
        self.sums: dict[Labels, float] = defaultdict(float)

    def observe(self, value: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        counts = self.counts.setdefault(key, [0] * (len(self.buckets) + 1))
        for i, b in enumerate(self.buckets):
            if value <= b:
                counts[i] += 1
        counts[-1] += 1  # +Inf
        self.sums[key] += value

    def count(self, **labels: str) -> int:
        counts = self.counts.get(tuple(sorted(labels.items())))
        return counts[-1] if counts else 0

    def lines(self) -> list[str]:
        out = []
        for key, counts in sorted(self.counts.items()):
            for b, c in zip(self.buckets + (math.inf,), counts):
                out.append(f"{self.name}_bucket{_labels(key + (('le', _num(b)),))} {c}")
            out.append(f"{self.name}_sum{_labels(key)} {_num(self.sums[key])}")
            out.append(f"{self.name}_count{_labels(key)} {counts[-1]}")
        return out


class Metrics:
    """The server's metrics; `render()` is the /metrics body."""

    def __init__(self) -> None:
        self.requests = Counter("pyrodash_requests_total", "HTTP requests by route, model and status code.")
        self.in_flight = Gauge("pyrodash_requests_in_flight", "Engine requests running now.")
        self.handoffs = Counter("pyrodash_handoffs_total", "Requests in which the SLM handed off to the LLM.")
        self.fallbacks = Counter("pyrodash_fallbacks_total", "Requests finished by the SLM after the LLM failed.")
        self.llm_errors = Counter("pyrodash_llm_errors_total", "Failed LLM attempts (retried, or then a fallback).")
        self.outside_share = Counter("pyrodash_outside_handoff_share_total",
                                     "Requests outside their operating point's handoff_share (the SLM answered "
                                     "alone).")
        self.usage_estimated = Counter("pyrodash_usage_estimated_total",
                                       "Requests with token counts a server did not report (counted or estimated).")
        self.errors = Counter("pyrodash_errors_total", "Failed requests by kind (client, upstream, disconnect).")
        self.tokens = Counter("pyrodash_tokens_total", "Tokens billed, by component (slm_in ... llm_cached_in).")
        self.llm_calls = Counter("pyrodash_llm_calls_total", "LLM requests made (retries included).")
        self.cost = Counter("pyrodash_cost_usd_total", "Dollars spent, priced with the server's price sheet.")
        self.latency = Histogram("pyrodash_request_duration_seconds", "Time from request to last byte.")
        self.ttft = Histogram("pyrodash_time_to_first_token_seconds", "Time from request to first content token.")
        self.trimmed = Counter("pyrodash_history_trimmed_messages_total",
                               "Earlier conversation messages dropped to fit a model's context window, by side.")
        self.trimmed_requests = Counter("pyrodash_history_trimmed_requests_total",
                                        "Requests whose history was trimmed for a model, by side.")
        self.ep_tokens = Counter("pyrodash_llm_endpoint_tokens_total", "LLM tokens billed per endpoint and component.")
        self.ep_calls = Counter("pyrodash_llm_endpoint_calls_total", "LLM calls that reached each endpoint.")
        self.ep_errors = Counter("pyrodash_llm_endpoint_errors_total", "LLM calls that failed, per endpoint.")
        self.ep_cost = Counter("pyrodash_llm_endpoint_cost_usd_total", "Dollars per LLM endpoint, at its own prices.")
        self._all = [self.requests, self.in_flight, self.handoffs, self.outside_share, self.fallbacks, self.llm_errors,
                     self.usage_estimated, self.errors, self.tokens, self.llm_calls, self.cost, self.latency,
                     self.ttft, self.trimmed, self.trimmed_requests, self.ep_tokens, self.ep_calls, self.ep_errors,
                     self.ep_cost]  # fmt: skip

    def observe_done(self, done: Done, model: str, latency_s: float, ttft_s: float | None) -> None:
        u = done.usage
        for comp in ("slm_in", "slm_out", "llm_in", "llm_out", "llm_cached_in"):
            self.tokens.inc(getattr(u, comp), component=comp)
        self.llm_calls.inc(u.llm_calls, model=model)
        self.cost.inc(done.cost_usd, model=model)
        if done.handoff is not None:
            self.handoffs.inc(model=model)
        if not done.handoff_admitted:
            self.outside_share.inc(model=model)
        if done.fallback:
            self.fallbacks.inc(model=model)
        if done.errors:
            self.llm_errors.inc(len(done.errors), model=model)
        if done.usage_estimated:
            self.usage_estimated.inc(model=model)
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
        self.latency.observe(latency_s, model=model)
        if ttft_s is not None:
            self.ttft.observe(ttft_s, model=model)

    def render(self) -> str:
        out: list[str] = []
        for m in self._all:
            out.append(f"# HELP {m.name} {m.help}")
            out.append(f"# TYPE {m.name} {m.kind}")
            out.extend(m.lines())
        return "\n".join(out) + "\n"
