// modelyard dashboard: polls /v2/stats and /v2/stats/timeseries once a second and
// redraws. Plain DOM and hand-drawn SVG; no libraries, nothing loaded from elsewhere.
"use strict";

const POLL_MS = 1000;
const WINDOW_S = 300;
const SVG_NS = "http://www.w3.org/2000/svg";
const PALETTE = ["#2f6fdb", "#1f9d55", "#d98c00", "#8e44ad", "#d23c3c", "#16a2b8",
  "#6d4c41", "#c2185b", "#5c6bc0", "#7cb342"];

// ------------------------------------------------------------------ helpers

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else el.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) el.append(c);
  return el;
}

function s(tag, attrs) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  return el;
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = n;
  while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${v.toFixed(i === 0 ? 0 : 1)} ${units[i]}`;
}

function msNumber(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const v = seconds * 1000;
  return v.toFixed(v >= 100 ? 0 : v >= 1 ? 1 : 2);
}

const ms = (seconds) => (seconds === null || seconds === undefined ? "–" : `${msNumber(seconds)} ms`);

function colour(name) {
  let hash = 0;
  for (const ch of name) hash = (hash * 31 + ch.charCodeAt(0)) >>> 0;
  return PALETTE[hash % PALETTE.length];
}

const keyOf = (m) => `${m.name}:${m.version}`;
const RESIDENT = new Set(["LOADING", "WARMING", "READY", "DRAINING"]);

// ------------------------------------------------------------------ memory bars

function renderDevices(stats) {
  const bars = stats.devices.map((dev) => {
    const budget = Math.max(dev.budget_bytes, 1);
    // A model's extra replicas hold their own bytes, maybe on other devices.
    const replicas = stats.models.flatMap((m) => (m.replicas ?? []).map((r) => ({
      name: m.name,
      version: `${m.version} ${r.replica.slice(r.replica.lastIndexOf("#"))}`,
      state: r.state === "draining" ? "DRAINING" : "READY",
      device: r.device,
      reserved_bytes: r.reserved_bytes,
      measured_bytes: r.measured_bytes,
    })));
    const holders = [...stats.models, ...replicas]
      .filter((m) => m.device === dev.name && m.reserved_bytes > 0)
      .sort((a, b) => b.reserved_bytes - a.reserved_bytes);
    const used = holders
      .filter((m) => RESIDENT.has(m.state))
      .reduce((t, m) => t + (m.measured_bytes ?? m.reserved_bytes), 0);
    const track = h("div", { class: "track", title: `budget ${bytes(dev.budget_bytes)}` });
    for (const m of holders) {
      const seg = h("div", {
        class: "segment",
        "data-model": m.name,
        "data-version": m.version,
        title: `${keyOf(m)} ${m.state}: ${bytes(m.reserved_bytes)} reserved`,
      });
      seg.style.width = `${Math.min(100, (100 * m.reserved_bytes) / budget)}%`;
      seg.style.background = colour(m.name);
      track.append(seg);
    }
    const marker = h("div", { class: "used-marker", title: `measured ${bytes(used)}` });
    marker.style.left = `${Math.min(100, (100 * used) / budget)}%`;
    track.append(marker);
    const legend = h("div", { class: "legend" },
      ...holders.map((m) => {
        const sw = h("span", { class: "swatch" });
        sw.style.background = colour(m.name);
        return h("span", {}, sw, `${keyOf(m)} ${bytes(m.reserved_bytes)}`);
      }));
    const pct = ((100 * dev.reserved_bytes) / budget).toFixed(1);
    return h("div", {
      class: "device-bar",
      "data-device": dev.name,
      "data-budget-bytes": dev.budget_bytes,
      "data-reserved-bytes": dev.reserved_bytes,
      "data-used-bytes": used,
    },
    h("div", { class: "device-label" },
      h("span", {
        class: "device-name",
        text: dev.unusable_reason ? `${dev.name} (unusable: ${dev.unusable_reason})` : dev.name,
      }),
      h("span", {
        class: "device-figures",
        text: `${bytes(dev.reserved_bytes)} reserved of ${bytes(dev.budget_bytes)} (${pct}%) · `
          + `${bytes(used)} measured · ${bytes(dev.free_bytes)} free`,
      })),
    track, legend);
  });
  document.getElementById("devices").replaceChildren(...bars);
}

// ------------------------------------------------------------------ models table

function renderModels(stats) {
  const rows = stats.models.map((m) => {
    const sched = m.scheduler || {};
    const breaker = sched.breaker_state ?? "–";
    const cell = (cls, text) => h("td", { class: cls, text: String(text) });
    const state = h("td", { class: "state-cell" },
      h("span", { class: "state", "data-state": m.state, text: m.state }));
    if (m.reason) state.append(h("span", { class: "reason", text: m.reason, title: m.reason }));
    return h("tr", {
      class: "model-row",
      "data-model": m.name,
      "data-version": m.version,
      "data-state": m.state,
    },
    cell("name", m.name), cell("version", m.version), state, cell("device", m.device),
    cell("num reserved", bytes(m.reserved_bytes)), cell("num measured", bytes(m.measured_bytes)),
    cell("num kv-cache", m.worker?.kv_cache_bytes ? bytes(m.worker.kv_cache_bytes) : "–"),
    cell("num requests", m.requests), cell("num pending", m.pending),
    cell("num cold-starts", m.cold_starts), cell("num evictions", m.evictions),
    cell("num restarts", m.restarts),
    h("td", { class: "breaker", "data-breaker": breaker, text: breaker }),
    cell("num last-load", m.last_load.total_s ? ms(m.last_load.total_s) : "–"));
  });
  document.getElementById("model-rows").replaceChildren(...rows);
  const ready = stats.models.filter((m) => m.ready).length;
  document.getElementById("ready-count").textContent = ready;
  document.getElementById("model-count").textContent = stats.models.length;
  document.getElementById("policy").textContent = stats.eviction_policy;
}

// ------------------------------------------------------------------ charts

const W = 300;
const H = 40;

function chart(metric, lines, bars) {
  const svg = s("svg", {
    class: "chart", "data-metric": metric, viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none",
  });
  svg.append(s("line", { class: "baseline", x1: 0, y1: H - 0.5, x2: W, y2: H - 0.5 }));
  const all = [...lines.flatMap((l) => l.values), ...(bars || [])].filter((v) => v !== null);
  const top = Math.max(...all, 0) * 1.15 || 1;
  const n = Math.max(...lines.map((l) => l.values.length), (bars || []).length, 2);
  const x = (i) => (i * W) / (n - 1);
  const y = (v) => H - 1 - ((H - 3) * v) / top;
  if (bars) {
    const bw = Math.max(W / n, 1);
    bars.forEach((v, i) => {
      if (v > 0) svg.append(s("rect", { class: "bar-cold", x: x(i) - bw / 2, y: y(v), width: bw, height: H - 1 - y(v) }));
    });
  }
  for (const line of lines) {
    // A null (no requests that second) breaks the line instead of drawing zero latency.
    let run = [];
    const flush = () => {
      if (run.length) svg.append(s("polyline", { class: line.cls, points: run.join(" ") }));
      run = [];
    };
    line.values.forEach((v, i) => {
      if (v === null) flush(); else run.push(`${x(i).toFixed(1)},${y(v).toFixed(1)}`);
    });
    flush();
  }
  const title = s("title", {});
  title.textContent = `max ${metric === "latency" ? ms(top / 1.15) : (top / 1.15).toFixed(1)}`;
  svg.append(title);
  return svg;
}

function lastValue(values) {
  for (let i = values.length - 1; i >= 0; i--) if (values[i] !== null) return values[i];
  return null;
}

// Charts span the feed's window, or less while the server is young: from the first
// second with traffic, and at least MIN_SPAN_S.
const MIN_SPAN_S = 60;
const SERIES = [
  "requests", "errors", "client_errors", "cold_starts", "p50_s", "p99_s", "ttft_p50_s", "tokens",
];

function trimmed(series) {
  const n = series.window_s;
  let first = n;
  for (const m of series.models) {
    const i = m.requests.findIndex((v, j) => v > 0 || m.cold_starts[j] > 0);
    if (i >= 0) first = Math.min(first, i);
  }
  const start = Math.max(0, Math.min(first, n - MIN_SPAN_S));
  const models = series.models.map((m) => {
    const out = { ...m };
    for (const k of SERIES) out[k] = m[k].slice(start);
    return out;
  });
  return { span: n - start, models };
}

function span(seconds) {
  return seconds < 120 ? `${seconds} s` : `${Math.round(seconds / 60)} minutes`;
}

function renderTraffic(feed, stats) {
  const series = trimmed(feed);
  document.getElementById("window").textContent = span(series.span);
  const resident = new Set(stats.models.filter((m) => RESIDENT.has(m.state)).map(keyOf));
  const cards = series.models
    .filter((m) => resident.has(keyOf(m)) || m.requests.some((v) => v > 0))
    .sort((a, b) => keyOf(a).localeCompare(keyOf(b)))
    .map((m) => {
      const recent = m.requests.slice(-5);
      const rate = recent.reduce((t, v) => t + v, 0) / Math.max(recent.length, 1);
      const cold = m.cold_starts.reduce((t, v) => t + v, 0);
      const errors = m.errors.reduce((t, v) => t + v, 0);
      const clientErrors = m.client_errors.reduce((t, v) => t + v, 0);
      const row = (label, value, cls, svg) => h("div", { class: "chart-row" },
        h("div", { class: "chart-label" }, label, h("b", { class: cls, text: value })), svg);
      const title = keyOf(m) + (errors ? ` · ${errors} model errors` : "")
        + (clientErrors ? ` · ${clientErrors} client errors` : "");
      const generative = m.active_sequences !== null && m.active_sequences !== undefined;
      const recentTokens = m.tokens.slice(-5);
      const tokensPerS = recentTokens.reduce((t, v) => t + v, 0) / Math.max(recentTokens.length, 1);
      const generation = generative ? [
        row("TTFT p50", `${msNumber(lastValue(m.ttft_p50_s))} ms`, "ttft-now",
          chart("latency", [{ cls: "line-p50", values: m.ttft_p50_s }])),
        row("tokens/s", tokensPerS.toFixed(1), "tokens-now",
          chart("rate", [{ cls: "line-rate", values: m.tokens }])),
        row("active sequences", String(m.active_sequences), "active-now", null),
      ] : [];
      return h("div", { class: "traffic-card", "data-model": m.name, "data-version": m.version },
        h("h3", { text: title }),
        row("req/s", rate.toFixed(1), "rate-now",
          chart("rate", [{ cls: "line-rate", values: m.requests }])),
        row("p50 / p99", `${msNumber(lastValue(m.p50_s))} / ${msNumber(lastValue(m.p99_s))} ms`, "latency-now",
          chart("latency", [{ cls: "line-p99", values: m.p99_s }, { cls: "line-p50", values: m.p50_s }])),
        row("cold starts", String(cold), "cold-now", chart("cold", [], m.cold_starts)),
        ...generation);
    });
  const box = document.getElementById("traffic");
  if (cards.length) box.replaceChildren(...cards);
  else box.replaceChildren(h("p", { class: "empty", text: "No traffic yet." }));
  const total = series.models.reduce((t, m) => t + (m.requests.at(-1) || 0), 0);
  document.getElementById("total-rate").textContent = total.toFixed(0);
}

// ------------------------------------------------------------------ events

function renderEvents(stats) {
  const items = stats.events.map((e) => h("li", { class: "event", "data-kind": e.kind },
    h("time", {
      datetime: new Date(e.time * 1000).toISOString(),
      text: new Date(e.time * 1000).toLocaleTimeString([], { hour12: false }),
    }),
    h("span", { class: "kind", text: e.kind }),
    h("span", { class: "model", text: `${e.model}:${e.version}` }),
    h("span", { class: "message", text: e.message, title: e.message })));
  const list = document.getElementById("events");
  if (items.length) list.replaceChildren(...items);
  else list.replaceChildren(h("li", { class: "empty", text: "No events yet." }));
}

// ------------------------------------------------------------------ polling

// A server with a management token answers the stats routes 401/403 without it. The
// token is asked for once and kept for this tab only (sessionStorage), never in the URL.
const TOKEN_KEY = "modelyard-management-token";
let tokenDeclined = false;

function askForToken(sent) {
  // Another request may already have asked (and got a newer token) meanwhile.
  if (tokenDeclined || sessionStorage.getItem(TOKEN_KEY) !== sent) return;
  const token = window.prompt("This server needs its management token (kept for this tab only):");
  if (token && token.trim()) sessionStorage.setItem(TOKEN_KEY, token.trim());
  else tokenDeclined = true;
}

async function getJson(url) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const headers = token ? { authorization: `Bearer ${token}` } : {};
  const r = await fetch(url, { cache: "no-store", headers });
  if (r.status === 401 || r.status === 403) {
    askForToken(token);
    throw new Error(`${url}: HTTP ${r.status}${tokenDeclined ? " (reload to enter a token)" : ""}`);
  }
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  return r.json();
}

function setConnection(state, text) {
  const el = document.getElementById("connection");
  el.dataset.state = state;
  el.textContent = text;
}

async function tick() {
  try {
    const [stats, series] = await Promise.all([
      getJson("/v2/stats"), getJson(`/v2/stats/timeseries?window_s=${WINDOW_S}`),
    ]);
    renderDevices(stats);
    renderModels(stats);
    renderTraffic(series, stats);
    renderEvents(stats);
    document.getElementById("updated").textContent =
      new Date().toLocaleTimeString([], { hour12: false });
    setConnection("live", "live");
  } catch (err) {
    setConnection("lost", `disconnected (${err.message})`);
  } finally {
    setTimeout(tick, POLL_MS);
  }
}

tick();
