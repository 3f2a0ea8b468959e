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
// read by the browser tests
window.cfDashboard = { updates: 0, admitted: {}, deferred: {}, charts };

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

// admitted and deferred per second, averaged over the last RATE_SECONDS whole seconds
// (the workers write their counts about twice a second: one second alone flickers)
const RATE_SECONDS = 10;

function rates(name) {
  const map = counts[name];
  const end = Math.floor(Date.now() / 1000) - 1;
  const sum = [0, 0];
  for (let second = end - RATE_SECONDS + 1; map && second <= end; second++) {
    const pair = map.get(second) || [0, 0];
    sum[0] += pair[0]; sum[1] += pair[1];
  }
  return sum.map((n) => Number((n / RATE_SECONDS).toFixed(1)));
}

// one level in a row's cell: a bar, then "used/capacity" (and what it counts)
function bar(td, used, capacity, keys, what) {
  const line = document.createElement("div");
  line.className = "level";
  const share = capacity ? Math.min(1, used / capacity) : 0;
  line.innerHTML = `<span class="bar"><span style="width:${(share * 100).toFixed(0)}%"></span></span>`;
  line.append(`${used}/${capacity}` + (what ? ` ${what}` : "") + (keys > 1 ? ` (${keys} keys)` : ""));
  td.appendChild(line);
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
    c.level.textContent = "";
    const level = f.level || {};
    if (f.seats) bar(c.level, f.seats.used, f.seats.capacity, f.seats.keys, "in use");
    if (level.capacity) bar(c.level, level.used, level.capacity, level.keys, "");
    if (level.error) c.level.append(`error: ${level.error}`);
    if (!c.level.textContent) c.level.textContent = "idle";
    const [admitted, deferred] = rates(f.name);
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

// a time axis label: UTC and 24-hour, as the CLI (uPlot's default: local time,
// 12-hour); seconds only where the ticks are less than a minute apart
function timeLabels(u, splits) {
  const step = splits.length > 1 ? splits[1] - splits[0] : 60;
  return splits.map((s) => new Date(s * 1000).toISOString().slice(11, step % 60 ? 19 : 16));
}

const CHART_HEIGHT = 180;

// the plot's width: its panel's inner width (the panel is a grid cell)
function plotWidth(box) {
  const style = getComputedStyle(box);
  return Math.max(200, Math.floor(box.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight)));
}

function chart(name) {
  if (charts[name]) return charts[name];
  const box = document.createElement("div");
  box.className = "chart";
  box.dataset.funnel = name;
  const title = document.createElement("h2");
  title.textContent = `${name}: decisions per second, last hour (UTC)`;
  box.appendChild(title);
  document.getElementById("charts").appendChild(box);
  const options = {
    width: plotWidth(box), height: CHART_HEIGHT,
    scales: { x: { time: true } },
    // a label takes about 8 characters: ticks at least 90 px apart never touch
    axes: [{ values: timeLabels, space: 90 }, {}],
    series: [
      { value: (u, v) => (v === null || v === undefined ? "–" : utc(v)) },
      { label: "admitted/s", stroke: "#2e7d32", width: 1.5 },
      { label: "deferred/s", stroke: "#ef6c00", width: 1 },
    ],
  };
  const plot = new uPlot(options, [[], [], []], box);
  new ResizeObserver(() => {
    const width = plotWidth(box);
    if (width !== plot.width) plot.setSize({ width, height: CHART_HEIGHT });
  }).observe(box);
  charts[name] = plot;
  return plot;
}

function showSeries() {
  // every chart spans the same hour, up to the last whole second
  const end = Math.floor(Date.now() / 1000) - 1;
  for (const [name, map] of Object.entries(counts)) {
    if (!map.size) continue;  // a chart for each funnel that decided something
    const xs = [], admitted = [], deferred = [];
    let total = 0, refused = 0;
    for (let second = end - HOUR + 1; second <= end; second++) {
      const pair = map.get(second) || [0, 0];
      xs.push(second); admitted.push(pair[0]); deferred.push(pair[1]);
      total += pair[0]; refused += pair[1];
    }
    chart(name).setData([xs, admitted, deferred]);
    window.cfDashboard.admitted[name] = total;
    window.cfDashboard.deferred[name] = refused;
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
