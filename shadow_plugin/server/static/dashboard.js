"use strict";
// The live dashboard: every POLL_MS it fetches the samples newer than the last one it holds
// (GET /v1/shadow/history?since=T) and the status (GET /v1/shadow/status), then redraws.
// Every chart's values are exposed for tests and users: window.shadowDashboard.charts[name] =
// {series: {line: [[t_s, value], ...]}, last: {line: value at the last sample},
//  totals: {counter: value at the last sample}, ceiling: the pool or the cap, drawn dashed},
// and on its <svg> as data-last / data-totals.
const D = window.shadowDashboard = {
  samples: [], status: null, charts: {}, updates: 0, error: null,
  key: sessionStorage.getItem("shadow-key"),
};
const POLL_MS = 1000;
const WINDOW_S = 900;                     // the charts show at most 15 minutes
const COLORS = ["#2f6fdb", "#e0742b", "#2e9e5b", "#c23b7a", "#7d5bd6", "#8a8f98", "#b58b00",
                "#1f9bb0"];
const $ = (id) => document.getElementById(id);
const fmt = (x, d = 0) => Number(x).toLocaleString("en-US", {maximumFractionDigits: d});

async function get(path) {
  const headers = D.key ? {Authorization: "Bearer " + D.key} : {};
  const r = await fetch(path, {headers, cache: "no-store"});
  if (r.status === 401) {
    $("keyform").hidden = false;
    throw new Error("this server needs its API key (enter it above)");
  }
  if (!r.ok) throw new Error(`${path}: ${r.status} ${(await r.text()).slice(0, 200)}`);
  return r.json();
}

$("keyform").addEventListener("submit", (ev) => {
  ev.preventDefault();
  D.key = $("key").value.trim();
  sessionStorage.setItem("shadow-key", D.key);
  $("keyform").hidden = true;
  tick();
});

// -- reading the samples -------------------------------------------------------------------
const val = (s, key) => s.values[key] ?? 0;
const HIT = (tier) => `shadow_prefix_cache_hit_tokens_total{tier="${tier}"}`;
const QUERIED = "shadow_prefix_cache_queried_tokens_total";
const REREAD = (cause) => `shadow_reread_tokens_total{cause="${cause}"}`;
const PAGES = (state) => `shadow_pages{state="${state}"}`;

function points(fn) {                       // [[t, fn(sample)], ...] over the held samples
  return D.samples.map((s) => [s.t, fn(s)]);
}

function rates(key) {                       // a counter's increase per second between samples
  const out = [];
  for (let i = 1; i < D.samples.length; i++) {
    const a = D.samples[i - 1], b = D.samples[i], dt = b.t - a.t;
    if (dt > 0) out.push([b.t, Math.max(val(b, key) - val(a, key), 0) / dt]);
  }
  return out;
}

function backlogSeries() {
  const out = {}, prefix = 'shadow_backlog_ids{session="';
  D.samples.forEach((s) => {
    for (const [k, v] of Object.entries(s.values)) {
      if (k.startsWith(prefix)) (out[k.slice(prefix.length, -2)] ||= []).push([s.t, v]);
    }
  });
  return out;
}

// -- the charts: name -> () => {series, totals, headline, percent} ---------------------------
const CHARTS = {
  hit_rate() {
    const q = (s) => val(s, QUERIED);
    const ratio = (s, n) => (q(s) > 0 ? n / q(s) : 0);
    const last = D.samples.at(-1);
    const hits = val(last, HIT("memory")) + val(last, HIT("disk"));
    return {percent: true,
      series: {all: points((s) => ratio(s, val(s, HIT("memory")) + val(s, HIT("disk")))),
               memory: points((s) => ratio(s, val(s, HIT("memory")))),
               disk: points((s) => ratio(s, val(s, HIT("disk"))))},
      totals: {queried: q(last), memory: val(last, HIT("memory")), disk: val(last, HIT("disk"))},
      headline: `${fmt(100 * ratio(last, hits), 1)} % of ${fmt(q(last))} prompt ids resumed ` +
                `from held pages and state`};
  },
  reads() {
    const last = D.samples.at(-1), t = {read: val(last, "shadow_read_tokens_total")};
    for (const c of ["bpe", "template", "other"]) t[c] = val(last, REREAD(c));
    return {series: {read: rates("shadow_read_tokens_total"), bpe: rates(REREAD("bpe")),
                     template: rates(REREAD("template")), other: rates(REREAD("other"))},
      totals: t, headline: `${fmt(t.read)} ids read; read again: ${fmt(t.bpe)} (BPE), ` +
                           `${fmt(t.template)} (template), ${fmt(t.other)} (other)`};
  },
  backlog() {
    const series = backlogSeries(), last = D.samples.at(-1), totals = {};
    for (const sid of Object.keys(series)) totals[sid] = last.values[`shadow_backlog_ids{session="${sid}"}`] ?? 0;
    const sum = Object.values(totals).reduce((a, b) => a + b, 0);
    return {series, totals, headline: `${fmt(sum)} ids behind over ${Object.keys(totals).length} sessions`};
  },
  turn_starts() {
    const key = (f) => `shadow_turn_starts_total{fresh="${f}"}`, last = D.samples.at(-1);
    const t = {fresh: val(last, key("true")), behind: val(last, key("false"))};
    const n = t.fresh + t.behind;
    return {series: {fresh: points((s) => val(s, key("true"))),
                     behind: points((s) => val(s, key("false")))},
      totals: t, headline: n ? `${fmt(100 * t.fresh / n, 1)} % of ${fmt(n)} turns began caught up` : "no turns yet"};
  },
  pages() {
    const last = D.samples.at(-1), pool = (s) => ["pinned", "cached", "free"].reduce((a, k) => a + val(s, PAGES(k)), 0);
    const t = {pinned: val(last, PAGES("pinned")), cached: val(last, PAGES("cached")),
               free: val(last, PAGES("free")), disk: val(last, PAGES("disk")), pool: pool(last)};
    return {ceiling: t.pool, ceilingName: "pool",
      series: {pinned: points((s) => val(s, PAGES("pinned"))),
               cached: points((s) => val(s, PAGES("cached")))},
      totals: t, headline: `${fmt(t.pinned)} pinned, ${fmt(t.cached)} cached, ${fmt(t.free)} free` +
                           ` of ${fmt(t.pool)}; ${fmt(t.disk)} on disk`};
  },
  memory() {
    const mib = (key) => (s) => val(s, key) / 2 ** 20, last = D.samples.at(-1);
    const t = {resident: val(last, "shadow_resident_bytes"), gdn: val(last, "shadow_gdn_entry_bytes"),
               cap: val(last, "shadow_resident_cap_bytes"), disk: val(last, "shadow_disk_bytes")};
    return {ceiling: t.cap / 2 ** 20, ceilingName: "cap",
      series: {resident: points(mib("shadow_resident_bytes")),
               gdn_entries: points(mib("shadow_gdn_entry_bytes"))},
      totals: t, headline: `${fmt(t.resident / 2 ** 20, 1)} of ${fmt(t.cap / 2 ** 20)} MiB resident` +
                           `; ${fmt(t.disk / 2 ** 20, 1)} MiB on disk`};
  },
  gdn() {
    const key = (st) => `shadow_gdn_entries{state="${st}"}`, last = D.samples.at(-1);
    const t = {resident: val(last, key("resident")), disk: val(last, key("disk"))};
    return {series: {resident: points((s) => val(s, key("resident"))),
                     disk: points((s) => val(s, key("disk")))},
      totals: t, headline: `${fmt(t.resident)} resident, ${fmt(t.disk)} on disk`};
  },
  host_share() {
    const last = D.samples.at(-1), t = {share: val(last, "shadow_host_share")};
    return {percent: true, series: {share: points((s) => val(s, "shadow_host_share"))},
      totals: t, headline: `${fmt(100 * t.share, 2)} % of the host's decode time`};
  },
};

// -- drawing ---------------------------------------------------------------------------------
const SVG = "http://www.w3.org/2000/svg";
function el(tag, attrs, parent) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  parent.appendChild(e);
  return e;
}

function span(now) {                      // the time shown: what is held, 1 to 15 min
  const first = D.samples.length ? D.samples[0].t : now;
  return Math.min(Math.max(now - first, 60), WINDOW_S);
}

function draw(name, chart, now) {
  const svg = $("c-" + name), w = svg.clientWidth || 400, h = svg.clientHeight || 150;
  const pad = {l: 44, r: 6, t: 6, b: 16}, spanS = span(now), t0 = now - spanS;
  svg.replaceChildren();
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  const shownPts = Object.values(chart.series).flat().filter((p) => p[0] >= t0);
  let ymax = Math.max(...shownPts.map((p) => p[1]), chart.percent ? 0.01 : 1);
  // a ceiling (the pool, the cap) is drawn dashed when it is within 4x of the data
  const ceiling = chart.ceiling !== undefined && chart.ceiling <= 4 * ymax ? chart.ceiling : null;
  ymax = 1.1 * Math.max(ymax, ceiling ?? 0);
  const x = (t) => pad.l + (w - pad.l - pad.r) * Math.max(t - t0, 0) / spanS;
  const y = (v) => h - pad.b - (h - pad.t - pad.b) * v / ymax;
  el("line", {x1: pad.l, x2: w - pad.r, y1: y(0), y2: y(0), stroke: "#ccd"}, svg);
  el("line", {x1: pad.l, x2: pad.l, y1: pad.t, y2: y(0), stroke: "#ccd"}, svg);
  if (ceiling !== null) {
    el("line", {x1: pad.l, x2: w - pad.r, y1: y(ceiling), y2: y(ceiling), stroke: "#999",
      "stroke-dasharray": "4 3"}, svg);
  }
  const label = (v) => (chart.percent ? `${fmt(100 * v, 1)} %` : fmt(v, v < 10 ? 1 : 0));
  el("text", {x: pad.l - 4, y: pad.t + 8, "text-anchor": "end"}, svg).textContent = label(ymax);
  el("text", {x: pad.l - 4, y: y(0), "text-anchor": "end"}, svg).textContent = label(0);
  el("text", {x: pad.l, y: h - 3}, svg).textContent =
    spanS >= 120 ? `-${fmt(spanS / 60, 1)} min` : `-${fmt(spanS)} s`;
  el("text", {x: w - pad.r, y: h - 3, "text-anchor": "end"}, svg).textContent = "now";
  const legend = $("l-" + name), last = {};
  legend.replaceChildren();
  Object.entries(chart.series).forEach(([line, pts], i) => {
    const color = COLORS[i % COLORS.length];
    const shown = pts.filter((p) => p[0] >= t0);
    if (shown.length) {
      el("polyline", {fill: "none", stroke: color, "stroke-width": 1.6,
        points: shown.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ")}, svg);
    }
    last[line] = pts.length ? pts.at(-1)[1] : null;
    const item = document.createElement("span");
    item.innerHTML = `<i style="background:${color}"></i>`;
    item.append(`${line} ${last[line] === null ? "–" : label(last[line])}`);
    legend.appendChild(item);
  });
  if (chart.ceiling !== undefined) {
    const item = document.createElement("span");
    item.append(`- - ${chart.ceilingName} ${label(chart.ceiling)}`);
    legend.appendChild(item);
  }
  chart.last = last;
  svg.dataset.last = JSON.stringify(last);
  svg.dataset.totals = JSON.stringify(chart.totals);
  $("h-" + name).textContent = chart.headline;
}

function header(st) {
  $("model").textContent = st.model || "?";
  $("state").textContent = st.state + (st.state === "ready" ? "" : ` (${st.stage || ""})`);
  $("device").textContent = st.device ? `${st.device} ${st.dtype}` : "…";
  $("grid").textContent = st.grid ?? "…";
  $("num-sessions").textContent = st.sessions ? Object.keys(st.sessions).length : 0;
  $("random-banner").hidden = !st.random_weights;
  $("updated").textContent = new Date().toLocaleTimeString();
}

function sessionsTable(st) {
  const body = $("sessions").tBodies[0], answers = {};
  for (const a of st.last_answers || []) answers[a.session] = a;     // the newest wins
  body.replaceChildren();
  const rows = Object.entries(st.sessions || {}).sort((a, b) => b[1].backlog - a[1].backlog);
  for (const [sid, s] of rows) {
    const a = answers[sid], tr = body.insertRow();
    const cells = [sid, s.residency, fmt(s.num_ids), fmt(s.committed), fmt(s.backlog),
      fmt(s.bytes / 2 ** 20, 1), a ? a.label : "–", a ? fmt(a.p, 2) : "–",
      a ? `${fmt(Math.max(D.now - a.time, 0))} s ago` : "–"];
    cells.forEach((c, i) => {
      const td = tr.insertCell();
      td.textContent = c;                   // text only: ids and labels come from clients
      if (i === 6) td.className = "label";
    });
    tr.dataset.session = sid;
    tr.dataset.backlog = s.backlog;
    tr.dataset.numIds = s.num_ids;
  }
}

function render() {
  if (D.status) {
    header(D.status);
    sessionsTable(D.status);
  }
  if (!D.samples.length) return;
  const now = Math.max(D.samples.at(-1).t, D.now);
  for (const [name, make] of Object.entries(CHARTS)) {
    const chart = make();
    draw(name, chart, now);
    D.charts[name] = chart;
  }
}

async function tick() {
  if (D.busy) return;                       // a slow answer: the next poll waits for it
  D.busy = true;
  try {
    const since = D.samples.length ? D.samples.at(-1).t : 0;
    const h = await get("/v1/shadow/history?since=" + since);
    D.everyS = h.every_s;
    D.now = h.now;                          // the server's clock: the client's may differ
    D.samples.push(...h.samples);
    while (D.samples.length && D.samples[0].t < h.now - WINDOW_S - 60) D.samples.shift();
    D.status = await get("/v1/shadow/status");
    render();
    D.error = null;
    D.updates += 1;
  } catch (e) {
    D.error = String(e && e.message ? e.message : e);
  } finally {
    D.busy = false;
  }
  $("error").hidden = !D.error;
  $("error").textContent = D.error || "";
}

tick();
setInterval(tick, POLL_MS);
