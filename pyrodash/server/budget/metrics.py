"""`pyrodash_budget_*` in /metrics: each budget's target, spend, controller knob and hard cap (its reservations,
denials, expiries, overruns and utilisation), and the replica's Redis fallback and share (docs/budgets.md)."""

from __future__ import annotations

# `pyrodash_budget_*`: attribute -> (kind, metric name, help, labels beside `budget`). Gauges keep the newest value
# of any worker of `--workers N` (one state); counters add up over workers and replicas.
BUDGET_METRICS = {
    "target": ("gauge", "target_usd_per_hour", "The budget's target spend rate (this replica's share of it while "
               "Redis is unreachable).", ()),
    "spend": ("counter", "spend_usd", "Dollars billed on the budget by this replica's requests (sum over "
              "replicas).", ()),
    "rate": ("gauge", "spend_rate_usd_per_hour", "The budget's measured spend rate (the controller's average).", ()),
    "period_spend": ("gauge", "period_spend_usd", "Dollars spent in the budget's current period (hour or day), "
                     "answers in flight at their expected dollars.", ()),
    "cap": ("gauge", "cap_usd", "The budget's hard cap per period.", ()),
    "knob": ("gauge", "knob", "The controller's output: the handoff_share or offload_bias the last paced request got, "
             "and the spend fraction (0..1) behind it.", ("knob",)),
    "cap_hits": ("counter", "cap_hits", "Requests at the hard cap (answered by the SLM alone or refused).", ()),
    "requests": ("counter", "requests", "Requests drawn on the budget, by the state they got (paced, policy, "
                 "capped, refused, learning, solo).", ("state",)),
    "reserved": ("gauge", "reserved_usd", "Dollars reserved against the hard cap by requests in flight (their worst "
                 "case), as last seen.", ()),
    "turned": ("counter", "reservation_denied", "Requests whose reservation did not fit the hard cap, by outcome "
               "(slm: the SLM alone; refused; call: an LLM call not made, the SLM finished).", ("outcome",)),
    "expired": ("counter", "reservation_expired", "Reservations that outlived reservation_ttl_s: counted as spent at "
                "their worst case, corrected when their request's dollars came.", ()),
    "overrun": ("counter", "overrun_usd", "Dollars billed above what their requests reserved (usage reported above "
                "the request's bound): on the ledger as billed.", ()),
    "billed": ("counter", "settled_billed_usd", "Dollars billed by the settled requests of a capped budget.", ()),
    "held_total": ("counter", "settled_reserved_usd", "Dollars those requests had reserved on the cap.", ()),
    "ledger_errors": ("counter", "ledger_errors", "Steps the caps' ledger (or the budget's state) could not take, by "
                      "where (admission: answered 503; call: an LLM call not made; settle, pacer: the request's "
                      "dollars not recorded, its reservations left to expire at their worst case).", ("where",)),
    "anomalies": ("counter", "usage_anomalies", "Requests whose reported dollars were negative or not finite, by "
                  "kind (negative, non_finite): billed at their reservations' bound instead.", ("kind",)),
    "utilisation": ("gauge", "utilisation", "Billed / reserved dollars of this replica's settled requests on a "
                    "capped budget (1: every reserved dollar billed).", ()),
}  # fmt: skip


class BudgetMetrics:
    """`pyrodash_budget_*` (prometheus_client objects in the app's registry): `BUDGET_METRICS`, and the replica's
    Redis fallback and share."""

    def __init__(self, registry) -> None:
        from prometheus_client import Counter, Gauge

        for attr, (kind, name, text, labels) in BUDGET_METRICS.items():
            if kind == "gauge":
                labelled = ["budget", *labels]
                metric = Gauge(
                    f"pyrodash_budget_{name}", text, labelled, registry=registry, multiprocess_mode="mostrecent"
                )
            else:
                metric = Counter(f"pyrodash_budget_{name}", text, ["budget", *labels], registry=registry)
            setattr(self, attr, metric)
        self.fallback = Gauge(
            "pyrodash_budget_fallback",
            "1 while Redis is unreachable and this replica holds only its own share of each budget.",
            registry=registry,
            multiprocess_mode="max",
        )
        self.replica_share = Gauge(
            "pyrodash_budget_replica_share",
            "The share of each budget this replica holds (1 when the budget is shared through Redis, a file or in "
            "process).",
            registry=registry,
            multiprocess_mode="min",
        )
        self.fallback.set(0)
        self.replica_share.set(1)
