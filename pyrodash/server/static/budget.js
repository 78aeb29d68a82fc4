// The playground's budget card: what GET /v1/budget says (pyrodash.server.budget), refreshed every few seconds.
// For each budget: this period's dollars against its target and hard cap, the measured spend rate, the share of
// requests the pacer lets hand off now, and its state (paced by the budget, at the policy's own point, capped, or a
// replica on its own share because Redis is unreachable). Hidden when the server holds no budget.
(function () {
  "use strict";
  const KEY_STORE = "pyrodash.apiKey";  // where app.js keeps the API key
  const usd = (x) => (x == null ? "–" : "$" + (x < 0.01 ? x.toPrecision(3) : x.toFixed(2)));

  function card() {
    let el = document.getElementById("budget-card");
    if (el) return el;
    const side = document.querySelector("aside.side");
    if (!side) return null;
    el = document.createElement("div");
    el.className = "card budget";
    el.id = "budget-card";
    el.hidden = true;
    el.innerHTML = '<h3>Budget <span class="meter-state" id="budget-store"></span></h3><div id="budget-rows"></div>';
    side.insertBefore(el, side.children[1] || null);
    return el;
  }

  function row(b) {
    const knob = b.handoff_share != null ? "handoff_share " + b.handoff_share.toFixed(2)
      : "offload_bias " + (b.offload_bias == null ? "–" : b.offload_bias.toFixed(2));
    const state = b.capped ? "capped: the SLM alone until the " + b.period + " ends"
      : b.spend_fraction >= 1 ? "the policy's own point (the budget allows more)" : "paced by the budget";
    const pct = Math.min(100, (100 * b.period_spend_usd) / (b.cap_usd || b.target_usd_per_period || 1));
    return '<div class="budget-row" data-budget="' + b.name + '">' +
      "<div><b>" + b.name + "</b> · " + b.dollars + " dollars</div>" +
      "<div>this " + b.period + ": " + usd(b.period_spend_usd) + " of " + usd(b.target_usd_per_period) +
      (b.cap_usd != null ? " (cap " + usd(b.cap_usd) + ")" : "") + "</div>" +
      '<div class="bar" style="height:6px;background:#eee;border-radius:3px"><div style="height:6px;border-radius:3px;' +
      "background:" + (b.capped ? "#c92a2a" : "var(--llm-bar)") + ";width:" + pct.toFixed(1) + '%"></div></div>' +
      "<div>rate " + usd(b.spend_usd_per_hour) + "/h, target " + usd(b.target_usd_per_hour) + "/h</div>" +
      "<div>" + knob + " · " + state + "</div></div>";
  }

  async function refresh() {
    const el = card();
    if (!el) return;
    const key = localStorage.getItem(KEY_STORE) || "";
    try {
      const r = await fetch("/v1/budget", { headers: key ? { Authorization: "Bearer " + key } : {} });
      if (!r.ok) { el.hidden = true; return; }
      const body = await r.json();
      if (!body.data || !body.data.length) { el.hidden = true; return; }
      const s = body.store || {};
      document.getElementById("budget-store").textContent = s.fallback
        ? "Redis unreachable: this replica holds 1/" + Math.round(1 / s.replica_share) + " of it"
        : s.store === "redis" ? "shared by the replicas (Redis)" : "";
      document.getElementById("budget-rows").innerHTML = body.data.map(row).join("");
      el.hidden = false;
    } catch (e) {
      el.hidden = true;
    }
  }

  window.addEventListener("load", () => { refresh(); setInterval(refresh, 3000); });
})();
