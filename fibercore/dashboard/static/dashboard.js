// fibercore dashboard: polls /api/state once a second, draws the tables and uPlot charts.
// Text from the program (job names, errors, output) is set with textContent, never as HTML.
"use strict";

// The token came in the address (?token=...); this page's cookie carries it from now on, so it
// leaves the address bar and the history (nothing later shows it, or sends it in a Referer).
if (new URLSearchParams(location.search).has("token")) {
  history.replaceState(null, "", location.pathname);
}

const KEEP = 3600;  // points per chart (an hour at one a second)
const series = { t: [], tasks: [], busy: [], idle: [], starting: [], queued: [], depth: [], cpu: [], rss: [] };
let lastT = 0;
let charts = null;
let openLog = null;

function fmtBytes(n) {
  if (n === null || n === undefined) return "-";
  const mib = n / (1024 * 1024);
  return mib >= 1024 ? (mib / 1024).toFixed(1) + " GiB" : mib.toFixed(1) + " MiB";
}
function fmt(v) { return v === null || v === undefined ? "-" : String(v); }

function row(cells, attrs) {
  const tr = document.createElement("tr");
  for (const [name, value] of Object.entries(attrs || {})) tr.setAttribute(name, value);
  for (const cell of cells) {
    const td = document.createElement("td");
    const [text, cls] = Array.isArray(cell) ? cell : [cell, ""];
    td.textContent = fmt(text);
    if (cls) td.className = cls;
    tr.appendChild(td);
  }
  return tr;
}

function fill(id, rows) {
  const body = document.querySelector(`#${id} tbody`);
  body.replaceChildren(...rows);
}

function drawTables(s) {
  document.getElementById("program").textContent =
    `${s.program} · session ${s.session} · backend ${s.backend} · up ${Math.round(s.time - s.started)} s`;
  const m = s.master;
  document.getElementById("master").textContent =
    `master pid ${m.pid} · CPU ${fmt(m.cpu_percent)} % · ${fmtBytes(m.rss_bytes)} · ${m.threads} threads`;
  fill("pools", s.pools.map(p => {
    const c = p.worker_counts, st = p.stats;
    const err = p.broken || (p.last_error ? p.last_error.text : "");
    return row([p.name, [p.state, p.broken ? "state-broken" : ""], [c.busy, "num"], [c.idle, "num"], [c.starting, "num"],
      [c.dead, "num"], [p.queued, "num"], [p.running, "num"], [st.done_tasks, "num pool-done"],
      [st.failed_tasks, "num"], [st.retried_chunks + st.rerun_after_error, "num"], [p.tasks_per_s, "num"], [err, "error"]],
      { "data-pool": p.name });
  }));
  fill("jobs", s.jobs.map(j => {
    const tr = row([j.name, j.role, j.backend, j.jid, j.host, j.state, [j.cpu_percent, "num"], [fmtBytes(j.rss_bytes), "num"]],
      { class: "job", "data-jid": fmt(j.jid) });
    tr.addEventListener("click", () => showLog(j.jid, j.name));
    return tr;
  }));
  fill("queues", s.queues.map(q => row([q.id, [q.depth, "num"], [q.bytes, "num"], [q.readers, "num"], [q.processes, "num"]])));
  fill("managers", s.managers.map(m => row([m.kind, m.state, m.address, m.process ? `${m.process} (pid ${fmt(m.pid)})` : "-"])));
  fill("sync", s.sync.map(o => row([o.id, o.kind, o.state])));
}

function makeChart(id, labels, colors) {
  const el = document.getElementById(id);
  const opts = {
    width: Math.max(360, el.clientWidth || 420), height: 180,
    scales: { x: { time: true } },
    series: [{}, ...labels.map((label, i) => ({ label, stroke: colors[i], width: 1.5 }))],
    axes: [{}, { size: 50 }],
  };
  return new uPlot(opts, [[], ...labels.map(() => [])], el);
}

function drawCharts() {
  if (!window.uPlot || series.t.length === 0) return;
  if (!charts) {
    charts = {
      tasks: makeChart("chart-tasks", ["tasks/s"], ["#2f6fb0"]),
      workers: makeChart("chart-workers", ["busy", "idle", "starting"], ["#2f6fb0", "#8ab17d", "#e9c46a"]),
      queues: makeChart("chart-queues", ["queued tasks", "queue depth"], ["#9b5de5", "#f15bb5"]),
      master: makeChart("chart-master", ["CPU %", "memory MiB"], ["#e76f51", "#264653"]),
    };
  }
  charts.tasks.setData([series.t, series.tasks]);
  charts.workers.setData([series.t, series.busy, series.idle, series.starting]);
  charts.queues.setData([series.t, series.queued, series.depth]);
  charts.master.setData([series.t, series.cpu, series.rss]);
}

function addPoints(points) {
  for (const p of points) {
    series.t.push(p.t);
    series.tasks.push(p.tasks_per_s);
    series.busy.push(p.busy);
    series.idle.push(p.idle);
    series.starting.push(p.starting);
    series.queued.push(p.queued);
    series.depth.push(p.queue_depth);
    series.cpu.push(p.master_cpu);
    series.rss.push(p.master_rss === null ? null : p.master_rss / (1024 * 1024));
    lastT = p.t;
  }
  for (const key of Object.keys(series)) {
    const extra = series[key].length - KEEP;
    if (extra > 0) series[key].splice(0, extra);
  }
}

async function showLog(jid, name) {
  if (jid === null || jid === undefined) return;
  openLog = { jid: String(jid), name };
  document.getElementById("log-panel").hidden = false;
  document.getElementById("log-job").textContent = `${name} (${jid})`;
  await refreshLog();
}

async function refreshLog() {
  if (!openLog) return;
  const res = await fetch(`api/logs/${encodeURIComponent(openLog.jid)}`, { credentials: "same-origin" });
  const text = res.ok ? (await res.json()).text : `(no output: ${res.status} ${await res.text()})`;
  const pre = document.getElementById("log");
  pre.textContent = text || "(nothing printed yet)";
  pre.scrollTop = pre.scrollHeight;
}

async function tick() {
  const status = document.getElementById("status");
  try {
    const res = await fetch(`api/state?since=${lastT}`, { credentials: "same-origin" });
    if (!res.ok) throw new Error(`${res.status} ${await res.text()}`);
    const body = await res.json();
    addPoints(body.history);
    if (body.snapshot) drawTables(body.snapshot);
    drawCharts();
    if (openLog) await refreshLog();
    status.textContent = `updated ${new Date().toLocaleTimeString()}`;
    status.className = "status";
  } catch (err) {
    status.textContent = `no answer from the program (${err.message}): it may have ended`;
    status.className = "status stale";
  }
}

document.getElementById("log-close").addEventListener("click", () => {
  openLog = null;
  document.getElementById("log-panel").hidden = true;
});
tick();
setInterval(tick, 1000);
