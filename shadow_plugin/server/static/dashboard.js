// The live dashboard's polling (after charts.js): every POLL_MS it fetches the samples after the
// last one it holds (GET /v1/shadow/history?after=SEQ; the first time the last WINDOW_S only)
// and the status (GET /v1/shadow/status), then redraws. A new `started` in the history means
// the server started again: the samples held are dropped (its counters started from 0).
const POLL_MS = 1000;

async function get(path) {
  const headers = D.key ? {Authorization: "Bearer " + D.key} : {};
  let r;
  try {
    r = await fetch(path, {headers, cache: "no-store"});
  } catch (e) {                           // no answer at all: the server is down or away
    throw new Error("cannot reach the server: the page shows the last values it had");
  }
  if (r.status === 401) {
    $("keyform").hidden = false;
    throw new Error(D.key ? "the server refused this API key: enter it again above"
                          : "this server needs its API key: enter it above");
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
  const body = $("sessions").tBodies[0];
  body.replaceChildren();
  const rows = Object.entries(st.sessions || {}).sort((a, b) => b[1].backlog - a[1].backlog);
  for (const [sid, s] of rows) {
    const a = s.last_answer, tr = body.insertRow();
    const cells = [sid + (s.stale ? " (stale)" : ""), s.residency, fmt(s.num_ids),
      fmt(s.committed), fmt(s.backlog), fmt(s.bytes / 2 ** 20, 1), a ? a.label : "–",
      a ? fmt(a.p, 2) : "–", a ? `${fmt(Math.max(D.now - a.time, 0))} s ago` : "–"];
    cells.forEach((c, i) => {
      const td = tr.insertCell();
      td.textContent = c;                   // text only: ids and labels come from clients
      if (i === 0 || i === 6) {
        td.className = "text";
        td.title = c;
      }
    });
    tr.dataset.session = sid;
    tr.dataset.backlog = s.backlog;
    tr.dataset.numIds = s.num_ids;
  }
}

function showProblem() {
  const st = D.status, failed = st && st.state === "failed" ? `the model failed to load: ` +
    `${st.error || "see the server's log"}` : null;
  const text = D.error ? `${D.error} (last answer at ${D.lastOk || "never"})` : failed;
  $("error").hidden = !text;
  $("error").textContent = text || "";
  if (D.error && D.error.startsWith("cannot reach")) $("state").textContent = "unreachable";
}

async function history() {
  const q = D.samples.length ? `after=${D.samples.at(-1).seq}` : `window_s=${WINDOW_S + 60}`;
  let h = await get(`/v1/shadow/history?${q}`);
  if (D.started !== null && h.started !== D.started) {    // a new server: counters from 0
    D.samples = [];
    h = await get(`/v1/shadow/history?window_s=${WINDOW_S + 60}`);
  }
  D.started = h.started;
  D.everyS = h.every_s;
  D.now = h.now;                          // the server's clock: the browser's may differ
  D.samples.push(...h.samples);
  while (D.samples.length && D.samples[0].t < h.now - WINDOW_S - 60) D.samples.shift();
}

async function tick() {
  if (D.busy) return;                     // a slow answer: the next poll waits for it
  D.busy = true;
  try {
    await history();
    D.status = await get("/v1/shadow/status");
    header(D.status);
    sessionsTable(D.status);
    drawCharts();
    D.error = null;
    D.lastOk = new Date().toLocaleTimeString();
    D.updates += 1;
    $("keyform").hidden = true;
  } catch (e) {
    D.error = String(e && e.message ? e.message : e);
  } finally {
    D.busy = false;
  }
  showProblem();
}

tick();
setInterval(tick, POLL_MS);
