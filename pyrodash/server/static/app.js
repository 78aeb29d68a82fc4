// PyroDash playground: plain JS, no build step. Talks to the same server's OpenAI-compatible API.
// Streams /v1/chat/completions with pyrodash.sources=true: each content chunk says which model wrote it
// (pyrodash.source "slm" | "llm"), one chunk marks the handoff; the usage chunk's `pyrodash` object has the billed
// tokens, cost_usd_by_component and llm_only_cost_usd (an estimate: see llm_only_estimate.method).
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_STORE = "pyrodash.apiKey";
const COMPONENTS = ["slm_in", "slm_out", "llm_in", "llm_out"];
const state = {
  key: localStorage.getItem(KEY_STORE) || "",
  config: null,            // /playground/config
  models: [],              // /v1/models
  history: [],             // [{role, content, tool_calls?, tool_call_id?}] sent with every chat request
  pending: [],             // the last answer's tool calls still waiting for their results (typed in the composer)
  busy: false,
  abort: null,
};

// ------------------------------------------------------------------ formatting

function usd(x) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  if (x === 0) return "$0";
  if (x >= 0.01) return "$" + x.toFixed(4);
  return "$" + x.toFixed(Math.min(12, 2 - Math.floor(Math.log10(x))));  // 3 significant digits, never 1e-7
}
function perThousand(x) {
  return x > 0 ? `$${(x * 1000).toFixed(x * 1000 >= 1 ? 2 : 4)} per 1,000 such answers` : "";
}
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

// ------------------------------------------------------------------ banners (errors shown in the page)

function banner(kind, title, detail, id) {
  if (id) { const old = document.querySelector(`.banner[data-id="${id}"]`); if (old) old.remove(); }
  const b = el("div", `banner ${kind}`);
  if (id) b.dataset.id = id;
  b.append(el("strong", null, title));
  if (detail) b.append(el("span", "detail", " " + detail));
  const x = el("button", "close", "×");
  x.type = "button";
  x.title = "dismiss";
  x.onclick = () => b.remove();
  b.append(x);
  $("banners").append(b);
  return b;
}
function clearBanner(id) {
  const old = document.querySelector(`.banner[data-id="${id}"]`);
  if (old) old.remove();
}

// ------------------------------------------------------------------ API

class APIError extends Error {
  constructor(status, body, fallbackText) {
    const err = (body && body.error) || {};
    super(err.message || fallbackText || `HTTP ${status}`);
    this.status = status; this.type = err.type; this.code = err.code; this.param = err.param;
  }
}

function headers(json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  if (state.key) h["Authorization"] = "Bearer " + state.key;
  return h;
}

async function api(path, opts = {}) {
  let r;
  try {
    r = await fetch(path, { ...opts, headers: headers(!!opts.body) });
  } catch (e) {
    throw new APIError(0, null, `the server at ${location.origin} cannot be reached (${e.message})`);
  }
  if (!r.ok) {
    let body = null, text = "";
    try { text = await r.text(); body = JSON.parse(text); } catch (_) { /* not JSON */ }
    const err = new APIError(r.status, body, text || `HTTP ${r.status}`);
    if (r.status === 401) needKey(err.message);
    throw err;
  }
  return r;
}

function showError(err, where) {
  const what = where ? `${where}: ` : "";
  if (err.status === 401) {
    banner("error", "Authentication failed.", what + err.message + " Enter the server's API key above.", "auth");
  } else if (err.status === 0) {
    banner("error", "Server unreachable.", what + err.message, "net");
  } else if (err.status >= 500 || err.type === "upstream_error") {
    banner("error", `Model backend error (HTTP ${err.status}).`, what + err.message, "upstream-" + (where || ""));
  } else {
    banner("error", `Request refused (HTTP ${err.status || "?"}).`, what + err.message, "req-" + (where || ""));
  }
}

// Read an SSE body: calls onChunk(obj) per JSON event; throws APIError on an in-stream {"error": ...}.
async function readSSE(response, onChunk) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        const obj = JSON.parse(data);
        if (obj.error) throw new APIError(obj.error.type === "upstream_error" ? 502 : 400, obj);
        onChunk(obj);
      }
    }
  }
}

// One streamed answer rendered into `target`: SLM/LLM segments, a handoff marker, a fallback marker.
class AnswerView {
  constructor(target, prices, onLive) {
    this.target = target; this.prices = prices; this.onLive = onLive;
    this.seg = null; this.source = null; this.handedOff = false;
    this.chunks = { slm: 0, llm: 0 };
    this.text = "";
    target.textContent = "";
    this.caret = el("span", "caret");
    target.append(this.caret);
  }
  add(source, text) {
    if (source === "slm" && this.source === "llm" || source === "slm" && this.handedOff && this.source === null) {
      // SLM text after the LLM's: a relay's SLM resuming after the LLM's step, or the SLM finishing after the LLM
      // failed; the answer's record says which (`settle`)
      this.resumed = this.marker("resume", "SLM resumes");
    }
    if (source !== this.source || !this.seg) {
      this.seg = el("span", `seg ${source}`);
      this.seg.title = source === "slm" ? "written by the small model (SLM)" : "written by the large model (LLM)";
      this.target.insertBefore(this.seg, this.caret);
      this.source = source;
    }
    this.seg.textContent += text;
    this.text += text;
    this.chunks[source] += 1;
    if (this.onLive) this.onLive(this.chunks);
    const pane = this.target.closest(".history");
    if (pane) pane.scrollTop = pane.scrollHeight;  // follow the stream
  }
  handoff(n) {
    this.handedOff = true;
    this.marker("handoff", `<offload> after ${n} SLM token${n === 1 ? "" : "s"} · LLM takes over`);
  }
  settle(info) {
    // after a failed LLM call the last resume was the fallback: say so
    if (info && info.fallback && this.resumed) {
      this.resumed.className = "marker fallback";
      this.resumed.textContent = "LLM failed · SLM finishes";
    }
  }
  toolCall(call) {
    // one tool call of the answer, and which model wrote it (the record's `tool_calls[].by`)
    const by = call.by === "llm" ? "llm" : "slm";
    const b = el("span", `call ${by}`, `⚙ ${call.name}(${call.arguments})`);
    b.title = by === "llm" ? "a tool call written by the large model (LLM)" : "a tool call written by the small model (SLM)";
    this.target.insertBefore(b, this.caret);
    this.seg = null; this.source = null;
  }
  marker(kind, label) {
    const m = el("span", `marker ${kind}`, label);
    this.target.insertBefore(m, this.caret);
    this.seg = null; this.source = null;
    return m;
  }
  end() { this.caret.remove(); }
}

// POST one streamed chat request; returns {text, info, usage, finish}.
async function streamChat(messages, mode, view, signal, extra = {}) {
  const body = {
    model: $("model").value || undefined,
    messages,
    stream: true,
    stream_options: { include_usage: true },
    max_tokens: Number($("max-tokens").value) || undefined,
    temperature: Number($("temperature").value),
    pyrodash: { mode, sources: true },
    ...extra,
  };
  if (mode === "collab") body.offload_bias = Number($("bias").value);
  const tools = mode === "collab" ? toolsOffered() : null;
  if (tools) body.tools = tools;
  const r = await api("/v1/chat/completions", { method: "POST", body: JSON.stringify(body), signal });
  let info = null, usage = null, finish = null;
  await readSSE(r, (c) => {
    const p = c.pyrodash;
    if (c.choices && c.choices.length) {
      const ch = c.choices[0];
      if (p && p.source === "handoff") view.handoff(p.handoff);
      else if (ch.delta && ch.delta.content) {
        const src = p && p.source ? p.source : (mode === "llm" ? "llm" : "slm");
        view.add(src, ch.delta.content);
      }
      if (ch.finish_reason) finish = ch.finish_reason;
    } else if (p) {
      info = p; usage = c.usage;
    }
  });
  view.settle(info);
  for (const call of (info && info.tool_calls) || []) view.toolCall(call);
  view.end();
  return { text: view.text, info, usage, finish, calls: (info && info.tool_calls) || [] };
}

// the Tools box's JSON (a list of function tools), or null when it is empty; a banner names a parse error
function toolsOffered() {
  const text = $("tools").value.trim();
  if (!text) return null;
  try { const t = JSON.parse(text); clearBanner("tools"); return Array.isArray(t) ? t : [t]; } catch (e) {
    banner("error", "The Tools box is not JSON:", e.message, "tools");
    return null;
  }
}

// the composer's hint: the next call waiting for its result, else the question
function askFor() {
  const c = state.pending[0];
  $("question").placeholder = c
    ? `Result of ${c.name}(${c.arguments}) (sent as the tool message)`
    : "Your question (Enter sends, Shift+Enter for a new line)";
}

// ------------------------------------------------------------------ the cost meter

function meterLive(chunks) {
  const p = state.config ? state.config.prices_usd_per_million : null;
  $("meter").dataset.state = "live";
  $("meter-state").textContent = "streaming · ≈ 1 chunk per token";
  for (const c of ["slm_in", "llm_in"]) { $("tok-" + c).textContent = "…"; $("usd-" + c).textContent = "…"; }
  for (const side of ["slm", "llm"]) {
    const n = chunks[side];
    $(`tok-${side}_out`).textContent = n ? `≈${n}` : "0";
    $(`usd-${side}_out`).textContent = p ? "≈" + usd((n * p[side + "_out"]) / 1e6) : "…";
  }
  const total = p ? (chunks.slm * p.slm_out + chunks.llm * p.llm_out) / 1e6 : 0;
  $("cost-total").textContent = "≈" + usd(total) + " +input";
  $("cost-llm-only").textContent = "…";
  $("tok-llm_only").textContent = "";
  $("saving").textContent = "";
}

function meterFinal(info) {
  const m = $("meter");
  m.dataset.state = "final";
  $("meter-state").textContent = info.fallback ? "billed · LLM failed, SLM finished" : "billed";
  const by = info.cost_usd_by_component || {};
  for (const c of COMPONENTS) {
    $("tok-" + c).textContent = String(info[c]);
    $("usd-" + c).textContent = usd(by[c]);
  }
  const total = $("cost-total");
  total.textContent = usd(info.cost_usd);
  total.dataset.usd = String(info.cost_usd);
  const only = $("cost-llm-only");
  const est = info.llm_only_estimate;
  only.textContent = (est && est.estimated ? "≈" : "") + usd(info.llm_only_cost_usd);
  only.dataset.usd = String(info.llm_only_cost_usd);
  $("tok-llm_only").textContent = est ? `${est.prompt_tokens} in + ${est.completion_tokens} out` : "";
  $("meter-how").textContent = est ? `LLM only: ${est.method}, at the LLM's prices.` : "";
  drawBars($("meter-bars"), [
    { label: "PyroDash", parts: COMPONENTS.map((c) => ({ cls: c.split("_")[0] + " " + c, v: by[c] || 0 })) },
    { label: info.mode === "llm" ? "LLM only" : "LLM only ≈", parts: [{ cls: "llm llm_only", v: info.llm_only_cost_usd || 0 }] },
  ]);
  const s = $("saving");
  s.dataset.more = "false";
  if (info.llm_only_cost_usd > 0 && info.mode === "collab") {
    const ratio = info.cost_usd / info.llm_only_cost_usd;
    s.dataset.more = String(ratio > 1);
    s.textContent = ratio <= 1
      ? `${Math.round((1 - ratio) * 100)}% cheaper than the LLM alone (estimate) · ${perThousand(info.cost_usd)}`
      : `${ratio.toFixed(2)}× the LLM-alone estimate · ${perThousand(info.cost_usd)}`;
  } else s.textContent = perThousand(info.cost_usd);
}

function drawBars(host, rows) {
  host.textContent = "";
  const max = Math.max(1e-18, ...rows.map((r) => r.parts.reduce((a, p) => a + p.v, 0)));
  for (const r of rows) {
    const row = el("div", "bar-row");
    row.append(el("span", "bar-label", r.label));
    const track = el("span", "bar-track");
    for (const p of r.parts) {
      if (p.v <= 0) continue;
      const b = el("span", "bar " + p.cls);
      b.style.width = `${(100 * p.v) / max}%`;
      b.title = `${p.cls.split(" ").pop()}: ${usd(p.v)}`;
      track.append(b);
    }
    row.append(track);
    const sum = r.parts.reduce((a, p) => a + p.v, 0);
    row.append(el("span", "bar-value", usd(sum)));
    host.append(row);
  }
}

// ------------------------------------------------------------------ chat

function addTurn(role, text) {
  $("history-empty").hidden = true;
  const t = el("div", `turn ${role}`);
  const who = el("div", "who", role === "user" ? "You" : role === "tool" ? "Tool result" : "PyroDash");
  const body = el("div", "body");
  if (text) body.textContent = text;
  t.append(who, body);
  $("history").append(t);
  t.scrollIntoView({ block: "end" });
  return { turn: t, body };
}

function footerFor(info, finish) {
  const f = el("div", "turn-foot");
  const parts = [];
  if (info.handoff_admitted === false) parts.push(`SLM alone (outside this model's handoff share) · ${info.slm_out} tokens`);
  else if (info.handoff === null || info.handoff === undefined) parts.push(`SLM alone · ${info.slm_out} tokens`);
  else if ((info.handoffs || []).length > 1) {
    const fb = info.relay_fallback ? ` (relay fell back: ${info.relay_fallback})` : "";
    parts.push(`relay: ${info.handoffs.length} handoffs, ${info.llm_calls} LLM calls, LLM ${info.llm_out} tok${fb}`);
  } else parts.push(`SLM ${info.handoff} tok → <offload> → LLM ${info.llm_out} tok`);
  parts.push(`${usd(info.cost_usd)} (LLM only ≈ ${usd(info.llm_only_cost_usd)})`);
  parts.push(`bias ${info.offload_bias}`);
  if (finish === "length") parts.push("cut at max tokens");
  const calls = info.tool_calls || [];
  if (calls.length) parts.push(`${calls.length} tool call${calls.length === 1 ? "" : "s"} (${calls.map((c) => c.by.toUpperCase()).join(", ")})`);
  if ((info.tool_call_errors || []).length) parts.push(`${info.tool_call_errors.length} unreadable call(s) dropped`);
  f.textContent = parts.join(" · ");
  return f;
}

async function sendChat(ev) {
  ev.preventDefault();
  const q = $("question").value.trim();
  if (!q || state.busy) return;
  if (!state.config) { await boot(); if (!state.config) return; }
  state.busy = true;
  $("send").disabled = true; $("stop").hidden = false;
  $("question").value = "";
  if (state.pending.length) {  // the text is the result of the next call waiting for one
    const call = state.pending.shift();
    state.history.push({ role: "tool", tool_call_id: call.id, content: q });
    addTurn("tool", `${call.name} → ${q}`);
    askFor();
    if (state.pending.length) { state.busy = false; $("send").disabled = false; $("stop").hidden = true; return; }
  } else addTurn("user", q);
  const messages = state.history.length && state.history[state.history.length - 1].role === "tool"
    ? [...state.history] : [...state.history, { role: "user", content: q }];
  const { turn, body } = addTurn("assistant", "");
  const view = new AnswerView(body, state.config.prices_usd_per_million, meterLive);
  state.abort = new AbortController();
  meterLive({ slm: 0, llm: 0 });
  try {
    const res = await streamChat(messages, "collab", view, state.abort.signal);
    if (res.info) {
      meterFinal(res.info);
      turn.append(footerFor(res.info, res.finish));
      if (res.info.fallback) {
        const calls = res.info.llm_calls;
        banner("warn", "The LLM failed; the SLM finished the answer (fallback).",
          (calls ? `${calls} LLM attempt(s) reached the LLM's server and broke off.` : "No LLM attempt reached the LLM's server.")
          + " Check the LLM backend (status above).", "fallback");
        checkHealth();
      } else clearBanner("fallback");
    }
    const wire = res.calls.map((c) => ({ id: c.id, type: "function", function: { name: c.name, arguments: c.arguments } }));
    state.history = [...messages, wire.length
      ? { role: "assistant", content: res.text || null, tool_calls: wire } : { role: "assistant", content: res.text }];
    state.pending = res.finish === "tool_calls" ? [...res.calls] : [];
    askFor();
  } catch (err) {
    view.end();
    if (err.name === "AbortError") turn.append(el("div", "turn-foot", "stopped"));
    else {
      turn.classList.add("failed");
      body.append(el("div", "turn-error", err.message));
      showError(err, "chat");
      $("meter").dataset.state = "error";
      $("meter-state").textContent = "failed";
    }
    turn.append(el("div", "turn-foot", "not kept in the conversation"));  // history is unchanged
  } finally {
    state.busy = false; state.abort = null;
    $("send").disabled = false; $("stop").hidden = true;
  }
}

// ------------------------------------------------------------------ compare

const FINAL_ANSWER = /\\boxed\{/;
// the response's pyrodash.answered_by in the "SLM only" column: which SLM answered alone
const ANSWERED_BY = {
  base_slm: "the base SLM answered alone, to the end",
  slm: "the served SLM alone, <offload> banned",
};

// who answers "SLM only" on this server (from /playground/config): its base SLM, else the served SLM
function slmOnlyLabel() {
  const cfg = state.config || {};
  return cfg.slm_only === "base_slm" ? `SLM only (base: ${cfg.base_slm})` : "SLM only (served SLM, no handoff)";
}

function showSlmOnly() {
  const cfg = state.config || {};
  const who = $("slm-only-who");
  who.textContent = cfg.slm_only === "base_slm"
    ? `the base SLM ${cfg.base_slm}, answering alone`
    : `the served SLM ${cfg.slm || ""} with <offload> banned: it may stop where it would hand off`;
  document.querySelector('.col[data-mode="slm"] h3').textContent = cfg.slm_only === "base_slm" ? "SLM only (base)" : "SLM only (served)";
}

async function sendCompare(ev) {
  ev.preventDefault();
  const q = $("compare-question").value.trim();
  if (!q) return;
  if (!state.config) { await boot(); if (!state.config) return; }
  $("compare-send").disabled = true;
  $("compare-bars").textContent = "";
  const results = {};
  const runs = ["slm", "llm", "collab"].map(async (mode) => {
    const col = document.querySelector(`.col[data-mode="${mode}"]`);
    col.dataset.state = "running";
    delete col.dataset.flag;
    col.querySelector(".col-status").textContent = "streaming…";
    col.querySelector(".col-cost").textContent = "";
    const view = new AnswerView(col.querySelector(".answer"), state.config.prices_usd_per_million, null);
    try {
      const res = await streamChat([{ role: "user", content: q }], mode, view, undefined);
      results[mode] = res.info;
      col.dataset.state = "done";
      const i = res.info;
      let status = i.handoff === null || i.handoff === undefined
        ? (mode === "collab" ? "SLM answered alone" : "answered alone")
        : `<offload> after ${i.handoff} SLM tokens` + (i.fallback ? " · LLM failed, SLM finished" : "");
      if (mode === "slm") status = `${ANSWERED_BY[i.answered_by] || "answered alone"}`;
      if (res.finish === "length") status += " · cut at max tokens";
      else if (mode === "slm" && !FINAL_ANSWER.test(res.text)) {  // a Stage 3 SLM, <offload> banned, stops early
        col.dataset.flag = "no-answer";
        status += " · stopped before a final answer (no \\boxed{})";
      }
      col.querySelector(".col-status").textContent = status;
      const cost = col.querySelector(".col-cost");
      cost.dataset.usd = String(i.cost_usd);
      cost.textContent = `${usd(i.cost_usd)} · in ${i.slm_in + i.llm_in} / out ${i.slm_out + i.llm_out} tokens`;
    } catch (err) {
      view.end();
      col.dataset.state = "error";
      col.querySelector(".col-status").textContent = "failed";
      col.querySelector(".answer").append(el("div", "turn-error", err.message));
      showError(err, { slm: slmOnlyLabel(), llm: "LLM only", collab: "PyroDash" }[mode]);
    }
  });
  await Promise.all(runs);
  if (results.collab) meterFinal(results.collab);  // the meter prices the PyroDash column
  const names = { slm: slmOnlyLabel(), llm: "LLM only", collab: "PyroDash" };
  drawBars($("compare-bars"), ["slm", "llm", "collab"].filter((m) => results[m]).map((m) => ({
    label: names[m],
    parts: COMPONENTS.map((c) => ({ cls: c.split("_")[0] + " " + c, v: (results[m].cost_usd_by_component || {})[c] || 0 })),
  })));
  $("compare-send").disabled = false;
}

// ------------------------------------------------------------------ settings, auth, health

function needKey(message) {
  $("auth-panel").hidden = false;
  if (message) $("auth-message").textContent = `The server answered: ${message} Enter its API key; the page keeps it in this browser and sends it as a Bearer header.`;
  $("api-key").focus();
}

function setBias(v) {
  $("bias").value = String(v);
  $("bias-range").value = String(Math.max(-10, Math.min(10, v)));
}

async function checkHealth() {
  const h = $("health");
  try {
    const r = await fetch("/health", { headers: headers(false) });  // details (which model is down) need the key
    const j = await r.json();
    if (!j.slm && !j.llm) {  // no key yet: only live / ready
      h.dataset.state = j.ready ? "ok" : "down";
      h.textContent = j.ready ? "models ready" : "a model is unreachable";
      h.title = "";
      return;
    }
    const down = ["slm", "llm"].filter((s) => j[s] && !j[s].reachable);
    h.dataset.state = down.length ? "down" : "ok";
    h.textContent = down.length ? `${down.map((s) => s.toUpperCase()).join(" and ")} unreachable` : "SLM ✓ · LLM ✓";
    h.title = down.map((s) => `${s}: ${j[s].error || "unreachable"}`).join("\n");
  } catch (e) {
    h.dataset.state = "down";
    h.textContent = "server unreachable";
  }
}

async function boot() {
  try {
    const cfg = await (await api("/playground/config")).json();
    const models = await (await api("/v1/models")).json();
    state.config = cfg; state.models = models.data;
    $("auth-panel").hidden = true;
    clearBanner("auth"); clearBanner("net");
    $("slm-name").textContent = cfg.slm || "?";
    $("llm-name").textContent = cfg.llm || "?";
    showSlmOnly();
    checkHealth();
    const sel = $("model");
    sel.textContent = "";
    for (const m of state.models) {
      const share = m.handoff_share != null && m.handoff_share < 1 ? `, handoff share ${m.handoff_share}` : "";
      const o = el("option", null, `${m.id} (bias ${m.offload_bias}${share})`);
      o.value = m.id; o.dataset.bias = m.offload_bias;
      sel.append(o);
    }
    sel.value = cfg.default_model;
    setBias(Number(sel.selectedOptions[0] ? sel.selectedOptions[0].dataset.bias : 0));
    $("max-tokens").max = String(cfg.max_tokens);
    $("max-tokens").value = String(cfg.default_max_tokens);
    const p = cfg.prices_usd_per_million;
    $("meter-how").textContent = `Prices per million tokens: SLM ${p.slm_in} in / ${p.slm_out} out, LLM ${p.llm_in} in / ${p.llm_out} out.`;
  } catch (err) {
    state.config = null;
    showError(err, "loading the server's settings");
  }
}

function init() {
  $("ask-form").addEventListener("submit", sendChat);
  $("question").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("ask-form").requestSubmit(); }
  });
  $("compare-form").addEventListener("submit", sendCompare);
  $("stop").onclick = () => state.abort && state.abort.abort();
  $("new-chat").onclick = () => {
    state.history = [];
    state.pending = [];
    askFor();
    $("history").querySelectorAll(".turn").forEach((t) => t.remove());
    $("history-empty").hidden = false;
  };
  $("model").onchange = () => setBias(Number($("model").selectedOptions[0].dataset.bias));
  $("bias-range").oninput = () => { $("bias").value = $("bias-range").value; };
  $("bias").oninput = () => {  // the box keeps what is typed (exact, -100..100); the slider shows it within ±10
    const v = Number($("bias").value);
    if (Number.isFinite(v)) $("bias-range").value = String(Math.max(-10, Math.min(10, v)));
  };
  $("key-button").onclick = () => needKey();
  $("key-form").addEventListener("submit", (e) => {
    e.preventDefault();
    state.key = $("api-key").value.trim();
    if (state.key) localStorage.setItem(KEY_STORE, state.key); else localStorage.removeItem(KEY_STORE);
    boot();
  });
  for (const [tab, view] of [["tab-chat", "chat-view"], ["tab-compare", "compare-view"]]) {
    $(tab).onclick = () => {
      for (const [t2, v2] of [["tab-chat", "chat-view"], ["tab-compare", "compare-view"]]) {
        $(t2).setAttribute("aria-selected", String(t2 === tab));
        $(v2).hidden = v2 !== view;
      }
    };
  }
  checkHealth();
  setInterval(checkHealth, 15000);
  boot();
}

init();
