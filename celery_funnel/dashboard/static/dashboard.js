// celery-funnel dashboard: polls api/state and api/series every second, draws one
// uPlot chart per funnel (admitted and deferred per second, last hour), and sends the
// controls as POSTs carrying the page's CSRF token.
"use strict";
const HOUR = 3600;
const csrf = document.querySelector("meta[name=csrf]").content;
const counts = {};   // funnel -> Map(second -> [admitted, deferred])
const charts = {};   // funnel -> uPlot
const rows = {};     // funnel -> <tr>
let since = null;
window.cfDashboard = { updates: 0, admitted: {} };  // read by the browser test

function text(value) { return value === null || value === undefined ? "–" : String(value); }

// an epoch time (seconds) as the CLI prints it: UTC, 24-hour
function utc(seconds) { return `${new Date(seconds * 1000).toISOString().slice(11, 19)} UTC`; }

function setStatus(message, error) {
  const el = document.getElementById("status");
  el.textContent = message;
  el.className = error ? "error" : "";
}

async function post(action, name, body) {
  const response = await fetch(`api/${action}/${encodeURIComponent(name)}`, {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf },
    body: JSON.stringify(body || {}),
  });
  const answer = await response.json().catch(() => ({}));
  if (!response.ok) {
    setStatus(`${action} ${name}: ${answer.error || response.status}`, true);
  } else {
    setStatus(`${action} ${name}: done`, false);
  }
  await refresh();
}

function cell(tr, className) {
  const td = document.createElement("td");
  if (className) td.className = className;
  tr.appendChild(td);
  return td;
}

function controls(td, name) {
  td.className = "controls";
  const fields = document.createElement("div");
  const buttons = document.createElement("div");
  td.append(fields, buttons);
  const inputs = {};
  for (const [field, hint] of [["rate", "20/s"], ["capacity", "cap"], ["concurrency", "conc"], ["ttl", "1h"]]) {
    const input = document.createElement("input");
    input.name = field;
    input.placeholder = hint;
    input.title = field;
    inputs[field] = input;
    fields.appendChild(input);
  }
  for (const action of ["set", "pause", "resume", "unset"]) {
    const button = document.createElement("button");
    button.textContent = action;
    button.dataset.action = action;
    button.dataset.funnel = name;
    button.addEventListener("click", () => {
      const body = {};
      for (const [field, input] of Object.entries(inputs)) if (input.value) body[field] = input.value;
      post(action, name, body);
    });
    buttons.appendChild(button);
  }
}

function row(name) {
  if (rows[name]) return rows[name];
  const tr = document.createElement("tr");
  tr.dataset.funnel = name;
  const cells = {};
  for (const key of ["name", "code", "override", "level", "admitted", "deferred", "parked", "held", "running"]) {
    cells[key] = cell(tr, ["admitted", "deferred", "parked", "held", "running"].includes(key) ? "num" : key);
  }
  controls(cell(tr), name);
  tr.cells_ = cells;
  document.querySelector("#funnels tbody").appendChild(tr);
  rows[name] = tr;
  return tr;
}

function describeOverride(o) {
  if (!o) return "";
  const parts = [];
  if (o.rate) parts.push(o.rate);
  if (o.capacity) parts.push(`capacity ${o.capacity}`);
  if (o.concurrency) parts.push(`concurrency ${o.concurrency}`);
  if (o.paused) parts.push("PAUSED");
  const at = utc(o.at);
  const until = o.expires_at ? `, until ${utc(o.expires_at)}` : "";
  return `${parts.join(", ")} — by ${o.by} at ${at}${until}`;
}

function lastSecond(name) {
  const map = counts[name];
  const second = Math.floor(Date.now() / 1000) - 1;
  return (map && map.get(second)) || [0, 0];
}

function showState(state) {
  for (const f of state.funnels) {
    const c = row(f.name).cells_;
    c.name.textContent = f.name;
    const code = f.code.map((x) => `${x.limit ? `${x.limit}: ` : ""}${x.rate} (capacity ${x.capacity}, ${x.strategy})`);
    if (f.concurrency) code.push(`${f.concurrency} at once`);
    c.code.textContent = code.join("; ");
    c.override.textContent = describeOverride(f.override);
    c.override.className = f.override && f.override.paused ? "paused" : "override";
    const level = f.level || {};
    if (level.capacity) {
      const share = Math.min(1, level.used / level.capacity);
      c.level.innerHTML = `<span class="bar"><span style="width:${(share * 100).toFixed(0)}%"></span></span>`;
      c.level.append(`${level.used}/${level.capacity}` + (level.keys > 1 ? ` (${level.keys} keys)` : ""));
    } else {
      c.level.textContent = level.error ? `error: ${level.error}` : "idle";
    }
    const [admitted, deferred] = lastSecond(f.name);
    c.admitted.textContent = admitted;
    c.deferred.textContent = deferred;
    c.parked.textContent = text(f.parked);
    c.held.textContent = text(f.held);
    c.running.textContent = text(f.running);
  }
}

function showDedupe(rows) {
  const table = document.getElementById("dedupe");
  table.hidden = !rows || rows.length === 0;
  const body = table.querySelector("tbody");
  body.textContent = "";
  for (const r of rows || []) {
    const tr = document.createElement("tr");
    for (const value of [r.task, r.kind, r.keys]) cell(tr).textContent = value;
    body.appendChild(tr);
  }
}

function chart(name) {
  if (charts[name]) return charts[name];
  const box = document.createElement("div");
  box.className = "chart";
  box.dataset.funnel = name;
  const title = document.createElement("h2");
  title.textContent = `${name}: decisions per second, last hour`;
  box.appendChild(title);
  document.getElementById("charts").appendChild(box);
  const options = {
    width: 500, height: 180,
    scales: { x: { time: true } },
    // UTC and 24-hour, as the CLI (uPlot's default: local time, 12-hour)
    axes: [{ values: (u, splits) => splits.map((s) => new Date(s * 1000).toISOString().slice(11, 19)) }, {}],
    series: [
      { value: (u, v) => (v === null || v === undefined ? "–" : utc(v)) },
      { label: "admitted/s", stroke: "#2e7d32", width: 1.5 },
      { label: "deferred/s", stroke: "#ef6c00", width: 1 },
    ],
  };
  charts[name] = new uPlot(options, [[], [], []], box);
  return charts[name];
}

function showSeries() {
  const end = Math.floor(Date.now() / 1000) - 1;
  for (const [name, map] of Object.entries(counts)) {
    if (!map.size) continue;  // a chart for each funnel that decided something
    const xs = [], admitted = [], deferred = [];
    let total = 0;
    // the last hour, or from just before the first decision kept
    const first = Math.max(end - HOUR + 1, Math.min(...map.keys()) - 5);
    for (let second = first; second <= end; second++) {
      const pair = map.get(second) || [0, 0];
      xs.push(second); admitted.push(pair[0]); deferred.push(pair[1]);
      total += pair[0];
    }
    chart(name).setData([xs, admitted, deferred]);
    window.cfDashboard.admitted[name] = total;
  }
}

async function refresh() {
  try {
    const query = since === null ? "" : `?since=${since}`;
    const [state, data] = await Promise.all([
      fetch("api/state", { credentials: "same-origin" }).then((r) => r.ok ? r.json() : Promise.reject(r.status)),
      fetch(`api/series${query}`, { credentials: "same-origin" }).then((r) => r.ok ? r.json() : Promise.reject(r.status)),
    ]);
    for (const [name, points] of Object.entries(data.funnels)) {
      const map = counts[name] || (counts[name] = new Map());
      for (const [second, a, r] of points) map.set(second, [a, r]);
      for (const second of map.keys()) if (second < data.end - HOUR) map.delete(second);
    }
    for (const f of state.funnels) if (!counts[f.name]) counts[f.name] = new Map();
    since = data.end - 1;
    showState(state);
    showDedupe(state.dedupe);
    showSeries();
    window.cfDashboard.updates += 1;
    if (!document.getElementById("status").classList.contains("error")) {
      setStatus(`updated ${utc(Date.now() / 1000)}`, false);
    }
  } catch (error) {
    setStatus(`cannot read the funnels: ${error}`, true);
  }
}

refresh();
setInterval(refresh, 1000);
