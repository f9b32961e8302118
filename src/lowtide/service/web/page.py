"""The web view's page: HTML, style and script, kept here as text so the server
serves them itself (no build step, no CDN: the page works offline) and a wheel
carries them without package data.

The script polls ``/api/view`` once a second and redraws: the segment graph as SVG
(one column per topological depth, a node per segment coloured by its state: green
advancing, red with stuck windows, grey before its first min time), two SVG charts of
each segment's lag and min time over the last hour (drawn here, no chart library),
then the tables. Every time it shows is a UTC timestamp (the document has wall-clock
ms, never slots). Everything a peer named (segments) goes in as text, never as markup.
"""

PAGE_HTML = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>lowtide</title>
<link rel="stylesheet" href="/app.css">
</head>
<body>
<header>
  <h1>lowtide <span id="pipeline"></span></h1>
  <div id="summary"></div>
  <div id="state" class="state">connecting</div>
</header>
<main>
  <section>
    <h2>Segment graph</h2>
    <p class="legend"><span class="key ok"></span>advancing
      <span class="key stuck"></span>stuck windows
      <span class="key idle"></span>no min time yet</p>
    <svg id="graph" xmlns="http://www.w3.org/2000/svg" width="10" height="10"></svg>
  </section>
  <section>
    <h2>Lag and min time, last hour</h2>
    <p class="legend" id="chart-legend"></p>
    <div class="charts">
      <figure><figcaption>lag (worst per 5 s)</figcaption>
        <svg id="chart-lag" xmlns="http://www.w3.org/2000/svg" width="10" height="10"></svg>
      </figure>
      <figure><figcaption>min time (UTC)</figcaption>
        <svg id="chart-min" xmlns="http://www.w3.org/2000/svg" width="10" height="10"></svg>
      </figure>
    </div>
  </section>
  <section>
    <h2>Segments</h2>
    <table><thead><tr><th>segment</th><th>min time (UTC)</th><th>lag</th><th>rows/s</th>
      <th>received</th><th>sent</th><th>open windows</th><th>in flight</th>
      <th>stuck windows</th></tr></thead><tbody id="segments"></tbody></table>
  </section>
  <section>
    <h2>Stuck windows</h2>
    <p id="stuck-none">none</p>
    <table><thead><tr><th>segment</th><th>window (UTC)</th><th>missing</th><th>extra</th>
      <th>stuck for</th><th class="what">what</th></tr></thead><tbody id="stuck"></tbody></table>
  </section>
  <section>
    <h2>Open windows</h2>
    <p id="open-windows-none">none: every sink is complete up to its last window</p>
    <table><thead><tr><th>sink</th><th>window (UTC)</th><th>ETA (UTC)</th>
      <th>past its SLA</th><th class="what">held by</th></tr></thead>
      <tbody id="open-windows"></tbody></table>
  </section>
  <section>
    <h2>Fronts</h2>
    <table><thead><tr><th>front</th><th>segment</th><th>heartbeat (UTC)</th>
      <th>heartbeat lag</th><th>state</th><th class="what">detail</th></tr></thead>
      <tbody id="fronts"></tbody></table>
    <ul id="front-events"></ul>
  </section>
  <section id="waiting-section" hidden>
    <h2>Waiting for a running batch (not lost)</h2>
    <ul id="waiting"></ul>
  </section>
  <section id="open-section" hidden>
    <h2>Open, no live front to close it</h2>
    <table><tbody id="open"></tbody></table>
  </section>
  <section id="late-section" hidden>
    <h2>Late records</h2>
    <table><thead><tr><th>front</th><th>clamped</th><th>rejected</th><th>raised</th>
      <th>out of range</th></tr></thead><tbody id="late"></tbody></table>
  </section>
  <section id="shards-section" hidden>
    <h2>Shards</h2>
    <table><thead><tr><th>shard</th><th>state</th></tr></thead>
      <tbody id="shards"></tbody></table>
  </section>
</main>
<script src="/app.js"></script>
</body>
</html>
"""

APP_CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #1d2330; background: #f6f7f9; }
header { background: #1d2330; color: #fff; padding: 10px 20px; display: flex; gap: 24px;
  align-items: baseline; flex-wrap: wrap; }
h1 { font-size: 20px; margin: 0; }
h2 { font-size: 15px; margin: 18px 0 6px; }
main { padding: 0 20px 20px; }
.state { margin-left: auto; }
.state.down { color: #ffb4a8; font-weight: bold; }
table { border-collapse: collapse; background: #fff; }
th, td { padding: 3px 10px; border-bottom: 1px solid #e1e4ea; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th.what, td.what { text-align: left; }
tr.stuck td, tr.stalled td { color: #b3261e; font-weight: bold; }
#graph { background: #fff; border: 1px solid #e1e4ea; }
.node rect { stroke: #1d2330; stroke-width: 1; }
.node.ok rect { fill: #2e9e5b; }
.node.stuck rect { fill: #d33a2c; }
.node.idle rect { fill: #8a94a6; }
.node text { fill: #fff; font-size: 12px; }
.node text.name { font-weight: bold; font-size: 13px; }
.edge { fill: none; stroke: #5b6474; stroke-width: 1.5; }
#arrow path { fill: #5b6474; }
.legend { margin: 0 0 6px; color: #5b6474; }
.key { display: inline-block; width: 12px; height: 12px; margin: 0 4px 0 12px;
  vertical-align: middle; }
.key.ok { background: #2e9e5b; } .key.stuck { background: #d33a2c; }
.key.idle { background: #8a94a6; }
.charts { display: flex; gap: 16px; flex-wrap: wrap; }
figure { margin: 0; }
figcaption { color: #5b6474; font-size: 12px; }
.chart { background: #fff; border: 1px solid #e1e4ea; }
.chart .axis { stroke: #8a94a6; stroke-width: 1; }
.chart .tick { fill: #5b6474; font-size: 11px; }
.chart .tick.end { text-anchor: end; }
.chart .series { fill: none; stroke-width: 2; }
"""

APP_JS = r"""
"use strict";
const SVG = "http://www.w3.org/2000/svg";
const POLL_MS = 1000;
const NODE_W = 240, NODE_H = 70, COL_GAP = 70, ROW_GAP = 24, PAD = 16;

function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function lag(ms) {
  if (ms === null || ms === undefined) return "\u2014";
  const a = Math.abs(ms);
  if (a < 1000) return ms + " ms";
  if (a < 120000) return (ms / 1000).toFixed(1) + " s";
  if (a < 7200000) return (ms / 60000).toFixed(1) + " min";
  return (ms / 3600000).toFixed(1) + " h";
}

function clock(ms) {
  return ms > 0 ? new Date(ms).toISOString().replace("T", " ").slice(0, 23) : "\u2014";
}

// [start, end) in UTC, the end without its date
function span(start_ms, end_ms) {
  return `[${clock(start_ms)}, ${clock(end_ms).slice(11)})`;
}

// front states shown in red
const TROUBLE = new Set(["lagging", "dead", "retired"]);

function rate(r) {
  if (r === null || r === undefined) return "\u2014";
  return r >= 100 ? Math.round(r).toLocaleString("en") : r.toFixed(1);
}

function count(n) {
  return n === null || n === undefined ? "\u2014" : n.toLocaleString("en");
}

function plural(n, word) {
  return `${count(n)} ${word}${n === 1 ? "" : "s"}`;
}

function trouble(seg, stuck) {
  if (seg.stuck_windows === 0) return "";
  let missing = 0, extra = 0;
  for (const w of stuck) if (w.segment === seg.name) { missing += w.missing; extra += w.extra; }
  const what = `${missing} missing` + (extra ? `, ${extra} extra` : "");
  return ` \u00b7 ${seg.stuck_windows} stuck: ${what}`;
}

function state(seg) {
  if (seg.stuck_windows > 0) return "stuck";
  return seg.lag_ms === null ? "idle" : "ok";
}

function positions(segments) {
  const rows = [], at = {};
  for (const seg of segments) {
    const row = rows[seg.depth] = (rows[seg.depth] || 0) + 1;
    at[seg.name] = {x: PAD + seg.depth * (NODE_W + COL_GAP),
                    y: PAD + (row - 1) * (NODE_H + ROW_GAP)};
  }
  return {at, columns: rows.length, rows: Math.max(1, ...rows.filter(Boolean))};
}

function drawGraph(view) {
  const g = document.getElementById("graph");
  g.replaceChildren();
  const {at, columns, rows} = positions(view.segments);
  g.setAttribute("width", 2 * PAD + Math.max(1, columns) * (NODE_W + COL_GAP) - COL_GAP);
  g.setAttribute("height", 2 * PAD + rows * (NODE_H + ROW_GAP) - ROW_GAP);
  const marker = svg("marker", {id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5,
                               markerWidth: 8, markerHeight: 8, orient: "auto"});
  marker.append(svg("path", {d: "M0,0 L10,5 L0,10 z"}));
  const defs = svg("defs");
  defs.append(marker);
  g.append(defs);
  for (const seg of view.segments) {
    for (const up of seg.inbound) {
      const a = at[up], b = at[seg.name], mid = (a.x + NODE_W + b.x) / 2;
      const d = `M${a.x + NODE_W},${a.y + NODE_H / 2} C${mid},${a.y + NODE_H / 2} ` +
                `${mid},${b.y + NODE_H / 2} ${b.x},${b.y + NODE_H / 2}`;
      g.append(svg("path", {class: "edge", d, "marker-end": "url(#arrow)"}));
    }
  }
  for (const seg of view.segments) {
    const p = at[seg.name];
    const node = svg("g", {class: "node " + state(seg), id: "node-" + seg.name,
                           transform: `translate(${p.x},${p.y})`});
    node.append(svg("rect", {width: NODE_W, height: NODE_H, rx: 6}));
    node.append(svg("text", {x: 10, y: 19, class: "name"}, seg.name));
    node.append(svg("text", {x: 10, y: 37}, "lag " + lag(seg.lag_ms) + " \u00b7 " +
                                            rate(seg.rows_per_s) + " rows/s"));
    node.append(svg("text", {x: 10, y: 55},
                    plural(seg.open_windows, "open window") + trouble(seg, view.stuck)));
    g.append(node);
  }
}

const COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                 "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
const CHART_W = 560, CHART_H = 200, M = {l: 92, r: 12, t: 10, b: 22};

function bounds(values, key) {
  let lo = Math.min(...values), hi = Math.max(...values);
  if (key === "lag_ms") lo = Math.min(0, lo);
  return [lo, hi > lo ? hi : lo + 1000];
}

// one line per segment (a dot at its latest point), x: UTC wall time, y: the figure
function drawChart(id, charts, key, label) {
  const g = document.getElementById(id);
  g.replaceChildren();
  g.setAttribute("class", "chart");
  g.setAttribute("width", CHART_W);
  g.setAttribute("height", CHART_H);
  const t = charts.t_ms;
  const values = charts.series.flatMap(s => s[key]).filter(v => v !== null);
  if (t.length === 0 || values.length === 0) {
    g.append(svg("text", {x: M.l, y: CHART_H / 2, class: "tick"}, "no figures yet"));
    return;
  }
  const x0 = t[0], x1 = t[t.length - 1] + charts.bucket_ms, [y0, y1] = bounds(values, key);
  const X = v => M.l + (v - x0) / (x1 - x0) * (CHART_W - M.l - M.r);
  const Y = v => CHART_H - M.b - (v - y0) / (y1 - y0) * (CHART_H - M.t - M.b);
  g.append(svg("line", {class: "axis", x1: M.l, y1: M.t, x2: M.l, y2: CHART_H - M.b}));
  g.append(svg("line", {class: "axis", x1: M.l, y1: CHART_H - M.b, x2: CHART_W - M.r,
                        y2: CHART_H - M.b}));
  g.append(svg("text", {x: M.l - 4, y: M.t + 10, class: "tick end"}, label(y1)));
  g.append(svg("text", {x: M.l - 4, y: CHART_H - M.b, class: "tick end"}, label(y0)));
  g.append(svg("text", {x: M.l, y: CHART_H - 6, class: "tick"}, clock(x0).slice(11, 19)));
  g.append(svg("text", {x: CHART_W - M.r, y: CHART_H - 6, class: "tick end"},
               clock(x1).slice(11, 19) + " UTC"));
  charts.series.forEach((s, i) => {
    const colour = COLOURS[i % COLOURS.length];
    let d = "", pen = "M", last = null;
    s[key].forEach((v, j) => {
      if (v === null) { pen = "M"; return; }
      last = [X(t[j]), Y(v)];
      d += `${pen}${last[0].toFixed(1)},${last[1].toFixed(1)} `;
      pen = "L";
    });
    if (last === null) return;
    g.append(svg("path", {class: "series", d, stroke: colour, "data-segment": s.segment}));
    g.append(svg("circle", {cx: last[0], cy: last[1], r: 3, fill: colour}));
  });
}

function drawCharts(charts) {
  drawChart("chart-lag", charts, "lag_ms", lag);
  drawChart("chart-min", charts, "min_time_ms", ms => clock(ms).slice(11, 23));
  document.getElementById("chart-legend").replaceChildren(...charts.series.map((s, i) => {
    const span = document.createElement("span");
    const key = document.createElement("span");
    key.className = "key";
    key.style.background = COLOURS[i % COLOURS.length];
    span.append(key, document.createTextNode(s.segment));
    return span;
  }));
}

function fill(id, rows) {
  const body = document.getElementById(id);
  body.replaceChildren(...rows.map(([cls, cells]) => {
    const tr = document.createElement("tr");
    if (cls) tr.className = cls;
    for (const [text, tdClass] of cells) {
      const td = document.createElement("td");
      td.textContent = text;
      if (tdClass) td.className = tdClass;
      tr.append(td);
    }
    return tr;
  }));
}

function lines(id, texts) {
  document.getElementById(id).replaceChildren(...texts.map(t => {
    const li = document.createElement("li");
    li.textContent = t;
    return li;
  }));
}

function render(view) {
  document.getElementById("pipeline").textContent = view.pipeline;
  document.getElementById("summary").textContent = view.graph_known
    ? `global min ${clock(view.global_min * view.delta_ms)} \u00b7 lag ` +
      `${lag(view.global_lag_ms)} \u00b7 ${view.connections} connections \u00b7 ` +
      `${count(view.acks_applied)} acks` +
      (view.ha ? ` \u00b7 ${view.ha.role}, epoch ${view.ha.epoch}` : "")
    : "no pipeline graph yet: it comes with the first agent";
  drawGraph(view);
  fill("segments", view.segments.flatMap(s => [[s.stuck_windows > 0 ? "stuck" : "", [
    [s.name], [clock(s.min_time_ms)], [lag(s.lag_ms)], [rate(s.rows_per_s)],
    [count(s.received)], [count(s.sent)], [count(s.open_windows)], [count(s.in_flight)],
    [count(s.stuck_windows)]]],
    // a row per key range (rule 15): the segment's min time is their minimum
    ...(s.key_ranges || []).map((k, r) => ["range", [
      [`${s.name}#${r}`], [clock(k.min_time_ms)], [lag(k.lag_ms)], [""], [""], [""],
      [""], [""], [""]]])]));
  drawCharts(view.charts);
  document.getElementById("stuck-none").hidden = view.stuck.length > 0;
  fill("stuck", view.stuck.map(w => ["stuck", [
    [w.segment], [span(w.start_ms, w.end_ms)], [count(w.missing)],
    [count(w.extra)], [lag(view.now_ms - w.since_ms)], [w.text, "what"]]]));
  document.getElementById("open-windows-none").hidden = view.open_windows.length > 0;
  fill("open-windows", view.open_windows.map(w => [w.late_ms > 0 ? "stuck" : "", [
    [w.sink], [span(w.start_ms, w.end_ms)],
    [w.eta_ms === null ? "never: a dead front holds it" : clock(w.eta_ms)],
    [w.late_ms === null ? "no SLA" : w.late_ms > 0 ? lag(w.late_ms) : "no"],
    [w.held_by, "what"]]]));
  fill("fronts", view.fronts.map(f => [TROUBLE.has(f.state) ? "stalled" : "", [
    [String(f.front)], [f.segment], [clock(f.heartbeat_ms)], [lag(f.heartbeat_lag_ms)],
    [f.state, "state-" + f.state], [f.detail, "what"]]]));
  lines("front-events", view.front_events.filter(e => e.includes(" dead")
                                                     || e.includes("retired")));
  document.getElementById("waiting-section").hidden = view.waiting.length === 0;
  lines("waiting", view.waiting);
  document.getElementById("open-section").hidden = view.open_ends.length === 0;
  fill("open", view.open_ends.map(text => ["stuck", [[text, "what"]]]));
  document.getElementById("late-section").hidden = view.late.length === 0;
  fill("late", view.late.map(r => ["", [[String(r.front)], [count(r.late_clamped)],
    [count(r.late_rejected)], [count(r.late_raised)], [count(r.out_of_range)]]]));
  document.getElementById("shards-section").hidden = view.shards.length === 0;
  fill("shards", view.shards.map(s => [s.connected ? "" : "stalled", [
    [s.url], [s.connected ? "up" : "DOWN"]]]));
}

function setState(text, down) {
  const e = document.getElementById("state");
  e.textContent = text;
  e.className = down ? "state down" : "state";
}

async function poll() {
  try {
    await refresh();
  } finally {  // a view that fails to draw must not stop the polling
    setTimeout(poll, POLL_MS);
  }
}

async function refresh() {
  let view;
  try {
    const reply = await fetch("/api/view", {cache: "no-store", credentials: "same-origin"});
    if (!reply.ok) throw new Error("HTTP " + reply.status);
    view = await reply.json();
  } catch (err) {
    setState(`no answer from the tracker (${err.message}), retrying`, true);
    return;
  }
  render(view);
  setState("live \u00b7 updated " + clock(view.now_ms).slice(11) + " UTC", false);
}

poll();
"""
