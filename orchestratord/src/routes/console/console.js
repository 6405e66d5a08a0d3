// The console at `/`: pools, the queue, the last minutes' throughput and time to first token
// (from the server's notes when it opens), recent tasks, and a chat that streams through the
// task API, sending the whole conversation (and a system prompt) each turn. It calls the same API as any
// client, with the key typed here (kept in this tab's session storage); panels that need an
// admin key are hidden from data keys.
"use strict";

const KEY = "orchd-key";
const HISTORY = 150; // samples kept for the charts (2 s apart: five minutes)
const $ = (id) => document.getElementById(id);

let scope = "unknown"; // "open" | "admin" | "data" | "none"
let running = null; // the chat task: { id, controller }
const samples = { tps: [], ttft: [] };
const TURNS = 40; // messages of the conversation sent back at most (the oldest go first)
let conversation = []; // the chat so far: { role, content }
let last = null; // the previous metrics reading
const outcomes = new Map(); // task id -> its record's outcome (records do not change)

function key() {
  return sessionStorage.getItem(KEY) || "";
}

function api(path, opts = {}) {
  const headers = Object.assign({}, opts.headers || {});
  if (key()) headers["authorization"] = "Bearer " + key();
  return fetch(path, Object.assign({}, opts, { headers }));
}

function notice(text) {
  $("notice").textContent = text || "";
}

function cell(row, text) {
  const td = document.createElement("td");
  td.textContent = text;
  row.appendChild(td);
}

function fill(tableId, rows) {
  const body = $(tableId).querySelector("tbody");
  body.replaceChildren();
  for (const r of rows) {
    const tr = document.createElement("tr");
    for (const c of r) cell(tr, c);
    body.appendChild(tr);
  }
}

// Which key this is: an admin key sees the control plane; a data key the rest.
async function whoAmI() {
  const r = await api("/v1/pools");
  if (r.status === 200) {
    scope = key() ? "admin" : "open";
  } else if (r.status === 403) {
    scope = "data";
  } else if (r.status === 401) {
    scope = "none";
  }
  const admin = scope === "admin" || scope === "open";
  for (const el of document.querySelectorAll(".admin")) el.classList.toggle("hidden", !admin);
  $("who").textContent = { admin: "admin key", open: "no key needed", data: "data key", none: "" }[scope] || "";
  notice(scope === "none" ? (key() ? "That key was refused." : "This server needs an API key.") : "");
}

async function refreshPools() {
  if (scope !== "admin" && scope !== "open") return;
  const [r, c] = await Promise.all([api("/v1/pools"), api("/v1/capabilities")]);
  if (!r.ok) return;
  const list = await r.json();
  const caps = c.ok ? await c.json() : { pools: [] };
  const ctx = new Map(caps.pools.map((p) => [p.pool_id, p.ctx_max]));
  fill("pools", list.pools.map((p) => [
    p.pool_id,
    p.state,
    p.model_ref.split("/").pop(),
    `${p.slots_total - p.slots_free}/${p.slots_total}`,
    ctx.has(p.pool_id) ? String(ctx.get(p.pool_id)) : "",
    String(p.queue_depth),
    p.metrics.prompt_tokens > 0
      ? `${Math.round((100 * p.metrics.prompt_tokens_reused) / p.metrics.prompt_tokens)} %`
      : "",
  ]));
}

async function refreshTenants() {
  if (scope !== "admin" && scope !== "open") return;
  const r = await api("/v1/tenants");
  if (!r.ok) return;
  const t = await r.json();
  fill("tenants", t.tenants.map((x) => [x.tenant, String(x.weight), String(x.queued), String(x.running), x.queue_share.toFixed(1)]));
}

async function refreshModels() {
  const r = await api("/v1/models");
  if (!r.ok) return;
  const m = await r.json();
  const names = m.data.map((d) => d.id);
  const list = $("models");
  list.replaceChildren(...m.data.map((d) => {
    const li = document.createElement("li");
    li.textContent = d.id + (d.loaded === false ? " (loads when asked for)" : "");
    return li;
  }));
  // the server's own choice first (the model a request naming none gets), then by name
  const select = $("model");
  const chosen = select.value;
  select.replaceChildren(new Option("the server's default model", ""), ...names.map((n) => new Option(n, n)));
  select.value = names.includes(chosen) ? chosen : "";
}

// One value of a Prometheus text exposition: the sum over the series of `name` whose labels
// contain `labels`.
function metric(text, name, labels = "") {
  let sum = 0;
  for (const line of text.split("\n")) {
    if (!line.startsWith(name)) continue;
    const rest = line.slice(name.length);
    if (rest[0] !== " " && rest[0] !== "{") continue;
    if (labels && !rest.includes(labels)) continue;
    const v = parseFloat(line.slice(line.lastIndexOf(" ") + 1));
    if (!Number.isNaN(v)) sum += v;
  }
  return sum;
}

function push(series, v) {
  series.push(v);
  if (series.length > HISTORY) series.shift();
}

function draw(svgId, series) {
  const svg = $(svgId);
  const max = Math.max(1, ...series);
  const step = 300 / Math.max(1, HISTORY - 1);
  const points = series.map((v, i) => `${(i * step).toFixed(1)},${(58 - (v / max) * 56).toFixed(1)}`).join(" ");
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", points);
  svg.replaceChildren(line);
}

// The server's notes of the last minutes, so the charts are not empty on opening.
async function loadHistory() {
  const r = await api("/console/history");
  if (!r.ok) return;
  const h = await r.json();
  for (const step of h.steps.slice(-HISTORY)) {
    push(samples.tps, step.tokens_per_s);
    push(samples.ttft, step.ttft_ms ?? 0);
  }
  draw("tps", samples.tps);
  draw("ttft", samples.ttft);
}

async function refreshMetrics() {
  const r = await api("/metrics");
  if (!r.ok) return;
  const text = await r.text();
  const now = performance.now();
  const reading = {
    at: now,
    tokens: metric(text, "orchd_tokens_out_total"),
    ttftSum: metric(text, "orchd_time_to_first_token_seconds_sum"),
    ttftCount: metric(text, "orchd_time_to_first_token_seconds_count"),
  };
  const rss = metric(text, "process_resident_memory_bytes");
  $("memory").textContent = rss ? `Resident memory ${(rss / 2 ** 20).toFixed(0)} MiB` : "";
  $("queue-classes").textContent =
    `interactive ${metric(text, "orchd_queue_depth", 'priority="interactive"')}, ` +
    `batch ${metric(text, "orchd_queue_depth", 'priority="batch"')} queued`;
  if (last) {
    const secs = (reading.at - last.at) / 1000;
    const tps = Math.max(0, (reading.tokens - last.tokens) / secs);
    const n = reading.ttftCount - last.ttftCount;
    const ttft = n > 0 ? ((reading.ttftSum - last.ttftSum) / n) * 1000 : 0;
    push(samples.tps, tps);
    push(samples.ttft, ttft);
    $("tps-now").textContent = `(now ${tps.toFixed(1)})`;
    $("ttft-now").textContent = n > 0 ? `(now ${ttft.toFixed(0)})` : "";
    draw("tps", samples.tps);
    draw("ttft", samples.ttft);
  }
  last = reading;
}

async function refreshTasks() {
  const r = await api("/v1/artifacts?kind=task_record&limit=8");
  if (!r.ok) return;
  const page = await r.json();
  const rows = [];
  for (const a of page.artifacts || []) {
    if (!outcomes.has(a.id)) {
      const rec = await api(`/v1/artifacts/${encodeURIComponent(a.id)}`);
      if (!rec.ok) continue;
      const body = await rec.json();
      const record = body.content || body;
      const t = record.terminal || {};
      outcomes.set(a.id, {
        outcome: t.event === "end" ? t.finish_reason : (t.code || t.event || "?"),
        tokens: String(record.tokens_out ?? ""),
      });
    }
    const o = outcomes.get(a.id);
    rows.push([a.id.slice(0, 13), new Date(a.created_at_ms).toLocaleTimeString(), o.outcome, o.tokens]);
  }
  fill("tasks", rows);
}

// The chat: a task of the task API, streamed with fetch (an EventSource cannot send a key).
function status(text, good) {
  const el = $("chat-status");
  el.textContent = text;
  el.className = good === undefined ? "" : good ? "ok" : "bad";
}

// The conversation so far, shown above the prompt.
function showConversation() {
  $("conversation").replaceChildren(...conversation.map((m) => {
    const p = document.createElement("p");
    p.className = m.role;
    p.textContent = (m.role === "user" ? "You: " : "Model: ") + m.content;
    return p;
  }));
}

function newChat() {
  if (running) return;
  conversation = [];
  $("answer").textContent = "";
  showConversation();
  status("");
}

async function send() {
  const content = $("prompt").value.trim();
  if (!content || running) return;
  $("answer").textContent = "";
  // the whole conversation goes back each turn (its system prompt first), as chat clients do
  const turns = conversation.concat([{ role: "user", content }]).slice(-TURNS);
  const system = $("system").value.trim();
  const body = {
    messages: (system ? [{ role: "system", content: system }] : []).concat(turns),
    max_tokens: parseInt($("max-tokens").value, 10) || 128,
  };
  if ($("model").value) body.model = $("model").value;
  const r = await api("/v1/tasks", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  const admitted = await r.json().catch(() => ({}));
  if (r.status !== 202) {
    const wait = admitted.retry_after_ms ?? (parseFloat(r.headers.get("retry-after") || "0") * 1000);
    const advice = r.status === 429 || admitted.retriable
      ? ` The server advises to come back in ${(wait / 1000).toFixed(1)} s.`
      : "";
    status(`Refused (${r.status} ${admitted.code || ""}): ${admitted.message || ""}.${advice}`, false);
    return;
  }
  status(`Queued: position ${admitted.queue_position}, predicted start in ${admitted.predicted_start_ms} ms`);
  const controller = new AbortController();
  running = { id: admitted.task_id, controller };
  $("stop").disabled = false;
  $("send").disabled = true;
  try {
    const answered = await follow(admitted.task_id, controller.signal);
    if (answered !== null) {
      conversation = turns.concat([{ role: "assistant", content: answered }]);
      $("prompt").value = "";
      $("answer").textContent = "";
      showConversation();
    }
  } catch (e) {
    if (e.name !== "AbortError") status(`The stream broke: ${e.message}`, false);
  } finally {
    running = null;
    $("stop").disabled = true;
    $("send").disabled = false;
  }
}

// Streams task `id` into the answer; returns the answer once it ended with text (null after
// an error, a cancel or nothing).
async function follow(id, signal) {
  const r = await api(`/v1/tasks/${encodeURIComponent(id)}/stream`, { signal });
  const reader = r.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return null;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const frame = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      let event = "message";
      let data = "";
      for (const line of frame.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data += line.slice(5).trim();
      }
      if (!data) continue;
      const d = JSON.parse(data);
      if (event === "started") {
        status(`Waiting: position ${d.queue_position}, predicted start in ${d.predicted_start_ms} ms`);
      } else if (event === "token") {
        if (!$("answer").textContent) status("Streaming…");
        $("answer").textContent += d.t;
      } else if (event === "end") {
        status(`Done: ${d.finish_reason}, ${d.tokens_out} tokens in ${d.decode_time_ms} ms`, d.finish_reason !== "cancelled");
        const text = $("answer").textContent;
        return d.finish_reason !== "cancelled" && text ? text : null;
      } else if (event === "error") {
        const advice = d.retry_after_ms ? ` Come back in ${(d.retry_after_ms / 1000).toFixed(1)} s.` : "";
        status(`Error ${d.code}: ${d.message}.${advice}`, false);
        return null;
      }
    }
  }
}

async function stop() {
  if (!running) return;
  await api(`/v1/tasks/${encodeURIComponent(running.id)}/cancel`, { method: "POST" });
}

async function tick() {
  try {
    await Promise.all([refreshPools(), refreshTenants(), refreshMetrics()]);
  } catch (e) {
    notice(`The server did not answer: ${e.message}`);
  }
}

async function start() {
  $("key").value = "";
  $("key-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    sessionStorage.setItem(KEY, $("key").value.trim());
    $("key").value = "";
    await whoAmI();
    if (!samples.tps.length) await loadHistory().catch(() => {});
    await Promise.all([tick(), refreshModels(), refreshTasks()]);
  });
  $("forget-key").addEventListener("click", async () => {
    sessionStorage.removeItem(KEY);
    await whoAmI();
  });
  $("send").addEventListener("click", send);
  $("stop").addEventListener("click", stop);
  $("new-chat").addEventListener("click", newChat);
  const health = await fetch("/health").then((r) => r.json()).catch(() => ({}));
  $("version").textContent = health.version ? `v${health.version}` : "";
  await whoAmI();
  await loadHistory().catch(() => {});
  await Promise.all([tick(), refreshModels(), refreshTasks()]);
  setInterval(tick, 2000);
  setInterval(() => refreshModels().catch(() => {}), 10000);
  setInterval(() => refreshTasks().catch(() => {}), 5000);
  document.body.dataset.ready = "true";
}

start();
