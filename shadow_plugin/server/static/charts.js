"use strict";
// The dashboard's charts (dashboard.js polls and calls drawCharts). Each chart is computed from
// the held samples ({seq, t, values: {prometheus name{labels}: value}}) and exposed for tests
// and users: window.shadowDashboard.charts[name] = {series: {line: [[t_s, value], ...]},
// last: {line: value at the last sample}, totals: {counter: value at the last sample},
// ceiling: the pool or the cap, drawn dashed}, and on its <svg> as data-last / data-totals.
const D = window.shadowDashboard = {
  samples: [], status: null, charts: {}, updates: 0, error: null, now: 0, started: null,
  key: sessionStorage.getItem("shadow-key"),
};
const WINDOW_S = 900;                     // the charts show at most 15 minutes
const MAX_LEGEND = 8;                     // lines a legend names (the largest first)
const COLORS = ["#2f6fdb", "#e0742b", "#2e9e5b", "#c23b7a", "#7d5bd6", "#8a8f98", "#b58b00",
                "#1f9bb0"];
const $ = (id) => document.getElementById(id);
const fmt = (x, d = 0) => Number(x).toLocaleString("en-US", {maximumFractionDigits: d});
const short = (text, n = 24) => (text.length > n ? text.slice(0, n - 1) + "…" : text);

// -- reading the samples -------------------------------------------------------------------
const val = (s, key) => s.values[key] ?? 0;
const HIT = (tier) => `shadow_prefix_cache_hit_tokens_total{tier="${tier}"}`;
const QUERIED = "shadow_prefix_cache_queried_tokens_total";
const REREAD = (cause) => `shadow_reread_tokens_total{cause="${cause}"}`;
const PAGES = (state) => `shadow_pages{state="${state}"}`;
const BACKLOG = 'shadow_backlog_ids{session="';

function points(fn) {                       // [[t, fn(sample)], ...] over the held samples
  return D.samples.map((s) => [s.t, fn(s)]);
}

function rates(key) {
  // a counter's increase per second between samples; a drop is a restart of the counter
  // (as Prometheus' rate() reads it): the new value is the increase
  const out = [];
  for (let i = 1; i < D.samples.length; i++) {
    const a = D.samples[i - 1], b = D.samples[i], dt = b.t - a.t;
    const inc = val(b, key) >= val(a, key) ? val(b, key) - val(a, key) : val(b, key);
    if (dt > 0) out.push([b.t, inc / dt]);
  }
  return out;
}

function backlogSeries() {
  // the sessions of the last sample only (a session gone or out of the largest is not shown)
  const last = D.samples.at(-1), out = {};
  for (const k of Object.keys(last.values)) {
    if (k.startsWith(BACKLOG)) out[k.slice(BACKLOG.length, -2)] = [];
  }
  for (const s of D.samples) {
    for (const sid of Object.keys(out)) {
      const v = s.values[`${BACKLOG}${sid}"}`];
      if (v !== undefined) out[sid].push([s.t, v]);
    }
  }
  return out;
}

// -- the charts: name -> () => {series, totals, headline, percent, ceiling} -----------------
const CHARTS = {
  hit_rate() {
    const q = (s) => val(s, QUERIED), ratio = (s, n) => (q(s) > 0 ? n / q(s) : 0);
    const last = D.samples.at(-1), hits = val(last, HIT("memory")) + val(last, HIT("disk"));
    return {percent: true,
      series: {all: points((s) => ratio(s, val(s, HIT("memory")) + val(s, HIT("disk")))),
               memory: points((s) => ratio(s, val(s, HIT("memory")))),
               disk: points((s) => ratio(s, val(s, HIT("disk"))))},
      totals: {queried: q(last), memory: val(last, HIT("memory")), disk: val(last, HIT("disk"))},
      headline: `${fmt(100 * ratio(last, hits), 1)} % of ${fmt(q(last))} prompt ids resumed ` +
                "from held pages and state"};
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
    const series = backlogSeries(), totals = {};
    for (const [sid, pts] of Object.entries(series)) totals[sid] = pts.at(-1)[1];
    const sum = Object.values(totals).reduce((a, b) => a + b, 0);
    return {series, totals,
      headline: `${fmt(sum)} ids behind over ${Object.keys(totals).length} sessions`};
  },
  turn_starts() {
    const key = (f) => `shadow_turn_starts_total{fresh="${f}"}`, last = D.samples.at(-1);
    const t = {fresh: val(last, key("true")), behind: val(last, key("false"))};
    const n = t.fresh + t.behind;
    return {series: {fresh: points((s) => val(s, key("true"))),
                     behind: points((s) => val(s, key("false")))},
      totals: t, headline: n ? `${fmt(100 * t.fresh / n, 1)} % of ${fmt(n)} turns began ` +
                               "caught up" : "no turns yet"};
  },
  pages() {
    const last = D.samples.at(-1);
    const pool = (s) => ["pinned", "cached", "free"].reduce((a, k) => a + val(s, PAGES(k)), 0);
    const t = {pinned: val(last, PAGES("pinned")), cached: val(last, PAGES("cached")),
               free: val(last, PAGES("free")), disk: val(last, PAGES("disk")), pool: pool(last)};
    return {ceiling: t.pool, ceilingName: "pool",
      series: {pinned: points((s) => val(s, PAGES("pinned"))),
               cached: points((s) => val(s, PAGES("cached")))},
      totals: t, headline: `${fmt(t.pinned)} pinned, ${fmt(t.cached)} cached, ` +
                           `${fmt(t.free)} free of ${fmt(t.pool)}; ${fmt(t.disk)} on disk`};
  },
  memory() {
    const mib = (key) => (s) => val(s, key) / 2 ** 20, last = D.samples.at(-1);
    const t = {resident: val(last, "shadow_resident_bytes"),
               gdn: val(last, "shadow_gdn_entry_bytes"),
               cap: val(last, "shadow_resident_cap_bytes"), disk: val(last, "shadow_disk_bytes")};
    return {ceiling: t.cap / 2 ** 20, ceilingName: "cap",
      series: {resident: points(mib("shadow_resident_bytes")),
               gdn_entries: points(mib("shadow_gdn_entry_bytes"))},
      totals: t, headline: `${fmt(t.resident / 2 ** 20, 1)} of ${fmt(t.cap / 2 ** 20)} MiB ` +
                           `resident; ${fmt(t.disk / 2 ** 20, 1)} MiB on disk`};
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
const SVG = "http://www.w3.org/2000/svg";   // the SVG namespace (a name, nothing is loaded)
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

function label(chart, v) {
  if (chart.percent) return `${fmt(100 * v, 1)} %`;
  return fmt(v, Math.abs(v) < 100 ? 1 : 0);
}

function legendItem(legend, color, text, title) {
  const item = document.createElement("span"), swatch = document.createElement("i");
  if (color) swatch.style.background = color;
  item.append(swatch, text);
  if (title) item.title = title;
  legend.appendChild(item);
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
  el("text", {x: pad.l - 4, y: pad.t + 8, "text-anchor": "end"}, svg).textContent =
    label(chart, ymax);
  el("text", {x: pad.l - 4, y: y(0), "text-anchor": "end"}, svg).textContent = label(chart, 0);
  el("text", {x: pad.l, y: h - 3}, svg).textContent =
    spanS >= 120 ? `-${fmt(spanS / 60, 1)} min` : `-${fmt(spanS)} s`;
  el("text", {x: w - pad.r, y: h - 3, "text-anchor": "end"}, svg).textContent = "now";
  const legend = $("l-" + name), last = {};
  legend.replaceChildren();
  const lines = Object.entries(chart.series);
  lines.forEach(([line, pts], i) => { last[line] = pts.length ? pts.at(-1)[1] : null; });
  // the largest lines first when there are many (sessions), each drawn in its colour
  const order = lines.length > MAX_LEGEND ?
    [...lines].sort((a, b) => (last[b[0]] ?? 0) - (last[a[0]] ?? 0)) : lines;
  order.forEach(([line, pts], i) => {
    const color = i < MAX_LEGEND ? COLORS[i % COLORS.length] : "#c9ced6";
    // a gap longer than 3 samples' time (the server was away) breaks the line
    let run = [];
    const flush = () => {
      if (run.length) {
        el("polyline", {fill: "none", stroke: color, "stroke-width": i < MAX_LEGEND ? 1.6 : 1,
          points: run.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ")}, svg);
      }
      run = [];
    };
    const gapS = 3 * Math.max(D.everyS || 1, 1);
    for (const p of pts.filter((q) => q[0] >= t0)) {
      if (run.length && p[0] - run.at(-1)[0] > gapS) flush();
      run.push(p);
    }
    flush();
    if (i < MAX_LEGEND) {
      const v = last[line] === null ? "–" : label(chart, last[line]);
      legendItem(legend, color, `${short(line)} ${v}`, line);
    }
  });
  if (order.length > MAX_LEGEND) legendItem(legend, null, `+${order.length - MAX_LEGEND} more`);
  if (chart.ceiling !== undefined) {
    legendItem(legend, null, `- - ${chart.ceilingName} ${label(chart, chart.ceiling)}`);
  }
  chart.last = last;
  svg.dataset.last = JSON.stringify(last);
  svg.dataset.totals = JSON.stringify(chart.totals);
  $("h-" + name).textContent = chart.headline;
}

function drawCharts() {
  if (!D.samples.length) return;
  const now = Math.max(D.samples.at(-1).t, D.now);
  for (const [name, make] of Object.entries(CHARTS)) {
    const chart = make();
    draw(name, chart, now);
    D.charts[name] = chart;
  }
}
