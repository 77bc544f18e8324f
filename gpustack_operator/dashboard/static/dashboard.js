// gpustack-operator dashboard: reads /events (server-sent events, same origin) and draws
// every node. Plain JavaScript, no library. Every string from the bus reaches the DOM as
// text (textContent / attributes), never as HTML.
"use strict";

const SAMPLES_KEPT = 120;
const STATUS_SILENCE_MS = 7000; // no status frame this long: the stream is not live

const view = {
  nodes: new Map(), // node name -> node state (see nodeState)
  streamUp: false, // the EventSource is open and frames arrive
  busUp: false, // the server holds a bus connection
  serverSkewMs: 0, // server clock - browser clock, from the status frames
  lastFrameAt: 0,
  ready: false,
};

function nodeState(name) {
  let n = view.nodes.get(name);
  if (!n) {
    n = {
      name, devices: null, agent: null, models: null,
      allocations: new Map(), health: new Map(), xids: new Map(), samples: [],
    };
    view.nodes.set(name, n);
  }
  return n;
}

// -- folding events (docs/bus.md; unknown kinds and fields are ignored) -------------------

function apply(ev) {
  if (!ev || ev.v !== 1 || typeof ev.node !== "string") return;
  const n = nodeState(ev.node);
  switch (ev.kind) {
    case "devices": n.devices = ev; break;
    case "agent": n.agent = ev; break;
    case "models": n.models = ev; break;
    case "allocations":
      if (ev.action === "released") n.allocations.delete(ev.allocationId);
      else n.allocations.set(ev.allocationId, ev);
      break;
    case "health":
      n.health.set(ev.acceleratorId, ev);
      if (ev.xid !== null && ev.xid !== undefined) n.xids.set(ev.acceleratorId, ev.xid);
      break;
    case "samples":
      n.samples.push(ev);
      if (n.samples.length > SAMPLES_KEPT) n.samples.shift();
      break;
    default: break; // a kind this page does not know
  }
}

// -- small DOM helpers ----------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "class") e.className = v; else e.setAttribute(k, String(v));
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

const fmt = {
  gib: (mib) => (mib === null || mib === undefined ? "?" : (mib / 1024).toFixed(1)),
  num: (x, unit) => (x === null || x === undefined ? "–" : `${x}${unit}`),
  bytes(b) {
    if (b === null || b === undefined) return "?";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (b >= 1024 && i < units.length - 1) { b /= 1024; i += 1; }
    return `${b.toFixed(i ? 1 : 0)} ${units[i]}`;
  },
  ago(ms) {
    const s = Math.max(0, Math.round(ms / 1000));
    return s < 120 ? `${s}s` : s < 7200 ? `${Math.round(s / 60)}m` : `${Math.round(s / 3600)}h`;
  },
};

// -- what each card shows -----------------------------------------------------------------------

function latestSamples(n) {
  const byId = new Map();
  const last = n.samples[n.samples.length - 1];
  for (const s of (last && last.samples) || []) {
    for (const a of s.accelerators || []) byId.set(a.id, a);
  }
  return byId;
}

function utilOf(a) {
  // NVML gives no utilization on a card in MIG mode: its GPM graphics-engine activity stands in.
  if (!a) return null;
  if (a.coresUtilization !== undefined && a.coresUtilization !== null) return a.coresUtilization;
  const active = a.grEngineActive;
  return active === undefined || active === null ? null : Math.round(active * 100);
}

// One accelerator's series over the kept samples, oldest first (null where it reported none).
function history(n, id) {
  const h = { util: [], mem: [], power: [], first: null, last: null };
  for (const ev of n.samples) {
    for (const s of ev.samples || []) {
      for (const a of s.accelerators || []) {
        if (a.id !== id) continue;
        const at = Date.parse(ev.ts);
        if (!Number.isNaN(at)) { h.first = h.first === null ? at : h.first; h.last = at; }
        h.util.push(utilOf(a));
        h.mem.push(a.memory ? (100 * (a.memoryUsage || 0)) / a.memory : null);
        h.power.push(a.powerUsage === undefined ? null : a.powerUsage);
      }
    }
  }
  return h;
}

const MODES = { "": "exclusive", shared: "shared", sliced: "sliced", partitioned: "partitioned" };

function modeOf(resource) {
  if (resource.endsWith(".visibility")) return "visibility";
  const slash = resource.indexOf("/");
  const dot = resource.indexOf(".", slash);
  return dot < 0 ? "exclusive" : MODES[resource.slice(dot + 1)] || resource.slice(dot + 1);
}

const CARD_UNITS = 1600000; // a whole card in the ledger's units (bus/events.py, CardCharge)

// What slice of the card an allocation holds, in words: the mode and its caps or profile.
function sliceOf(a, mode) {
  if (mode === "partitioned") return a.profile ? `MIG ${a.profile}` : "MIG instance";
  if (mode === "exclusive") return "whole card";
  const caps = [];
  if (a.memoryMib) caps.push(`${fmt.gib(a.memoryMib)} GiB`);
  if (a.coresPercentage) caps.push(`${a.coresPercentage} % cores`);
  return caps.length ? `${mode} · ${caps.join(", ")}` : mode;
}

// Device ids are <group>:<accelerator id>:<index> (agent/deviceplugin/resources.py).
// One row per allocation touching the card: who holds it, which slice, how many units.
function allocationsOf(n, id) {
  const rows = [];
  for (const a of n.allocations.values()) {
    const units = (a.deviceIds || []).filter((d) => d.split(":")[1] === id).length;
    if (!units) continue;
    const mode = modeOf(a.resource || "");
    const charge = (a.charges || []).find((c) => c.acceleratorId === id);
    rows.push({
      mode, units, namespace: a.podNamespace || "", pod: a.podName || "", container: a.container || "",
      slice: sliceOf(a, mode), resource: a.resource || "",
      share: charge ? Math.round((100 * charge.units) / CARD_UNITS) : null,
    });
  }
  return rows;
}

function allocationSummary(rows) {
  const held = new Map(); // "mode" -> {units, pods}
  for (const r of rows) {
    const h = held.get(r.mode) || { units: 0, pods: [] };
    h.units += r.units;
    if (r.pod) h.pods.push(`${r.namespace}/${r.pod}`);
    held.set(r.mode, h);
  }
  return held.size
    ? [...held].map(([mode, h]) => `${mode} ×${h.units}${h.pods.length ? ` (${h.pods.join(", ")})` : ""}`).join("; ")
    : "free";
}

function allocationsTable(rows) {
  if (!rows.length) return null;
  return el("table", { class: "allocs" },
    el("tr", {}, el("th", {}, "namespace/pod"), el("th", {}, "slice"), el("th", {}, "units")),
    ...rows.map((r) => el("tr", {
      class: "alloc-row", "data-pod": r.pod, "data-namespace": r.namespace, "data-slice": r.slice,
      "data-units": r.units, title: `${r.resource}${r.container ? ` · container ${r.container}` : ""}`,
    },
    el("td", { class: "pod" }, r.pod ? `${r.namespace}/${r.pod}` : "(pod not yet known)"),
    el("td", {}, r.slice),
    el("td", { class: "units" }, `${r.units}${r.share !== null ? ` (${r.share} %)` : ""}`))));
}

function charts(hist) {
  const span = hist.first !== null && hist.last > hist.first
    ? `−${fmt.ago(hist.last - hist.first)}` : `${hist.util.length} sample(s)`;
  const usage = chart("usage", " %", [
    { values: hist.util, cls: "util", label: "util" },
    { values: hist.mem, cls: "mem", label: "mem" },
  ], { lo: 0, hi: 100 }, span);
  const out = [usage];
  if (present(hist.power).length) {
    out.push(chart("power", " W", [{ values: hist.power, cls: "power", label: "power" }],
      powerScale(hist.power), span));
  }
  return out;
}

function gpuCard(n, group, acc, sample) {
  const unhealthy = sample ? sample.unhealthy : acc.status && acc.status.unhealthy;
  const health = n.health.get(acc.id);
  const used = sample ? sample.memoryUsage : null;
  const total = (sample && sample.memory) || group.memory;
  const rows = allocationsOf(n, acc.id);
  const status = acc.status || {};
  const offers = [];
  if (status.physicalSliced) offers.push(`MIG ×${status.physicalSliced.count}`);
  if (status.logicalSliced) offers.push(`sliced ×${status.logicalSliced.count}`);
  let healthText = unhealthy ? "Unhealthy" : "Healthy";
  if (n.xids.has(acc.id)) healthText += ` · last XID ${n.xids.get(acc.id)}`;
  if (unhealthy && health && health.reason && !health.healthy) healthText += ` (${health.reason})`;
  const util = utilOf(sample);
  // GPM's tensor-pipe activity (Hopper on, from the agent's second pass): DCGM's
  // PIPE_TENSOR_ACTIVE, a ratio; absent elsewhere, so the row is too.
  const tensor = sample && typeof sample.tensorActive === "number" ? Math.round(sample.tensorActive * 100) : null;
  return el("section", { class: "gpu", "data-uuid": acc.id, "data-health": unhealthy ? "unhealthy" : "healthy" },
    el("div", { class: "title" }, el("span", {}, `GPU ${acc.index} · ${group.name}`),
      el("span", { class: "util", "data-value": util }, fmt.num(util, "%"))),
    el("div", { class: "uuid" }, acc.id),
    el("dl", {},
      el("dt", {}, "memory"), el("dd", { class: "memory" }, `${fmt.gib(used)} / ${fmt.gib(total)} GiB`),
      el("dt", {}, "temperature"), el("dd", { class: "temperature" }, fmt.num(sample && sample.temperature, " °C")),
      el("dt", {}, "power"), el("dd", { class: "power" }, fmt.num(sample && sample.powerUsage, " W")),
      tensor === null ? null : el("dt", {}, "tensor cores"),
      tensor === null ? null : el("dd", { class: "tensor" }, fmt.num(tensor, " % active")),
      el("dt", {}, "health"), el("dd", { class: `health ${unhealthy ? "unhealthy" : "healthy"}` }, healthText),
      el("dt", {}, "allocation"), el("dd", { class: "allocation" }, allocationSummary(rows)),
      offers.length ? el("dt", {}, "offers") : null, offers.length ? el("dd", {}, offers.join(", ")) : null),
    allocationsTable(rows),
    ...charts(history(n, acc.id)));
}

function modelRow(m) {
  const done = m.bytesDone || 0, total = m.bytesTotal || 0;
  const progress = m.state === "downloading" || (total && done < total)
    ? el("progress", { max: total || 1, value: done }) : null;
  return el("tr", { class: "model-row", "data-state": m.state },
    el("td", { class: "model" }, m.model),
    el("td", { class: `state-${m.state}` }, m.state),
    el("td", {}, progress, total ? ` ${fmt.bytes(done)} / ${fmt.bytes(total)}` : "–"),
    el("td", {}, m.message || m.reason || ""));
}

// The node's model cache, always: its capacity and use (the filesystem's, from the model
// agent's cache events) even when no model is cached, then one row per model.
function modelsSection(models) {
  const head = el("h3", {}, "Model cache");
  if (!models) {
    return el("section", { class: "cache", "data-reported": "false" }, head,
      el("p", { class: "empty" }, "No report from this node's model agent yet."));
  }
  const list = models.models || [];
  const cap = models.capacityBytes, used = models.usedBytes;
  const pct = cap && used !== null && used !== undefined ? Math.min(100, (100 * used) / cap) : null;
  const usage = el("div", { class: "cache-usage" },
    el("div", { class: "bar" }, el("div", { class: `fill${pct !== null && pct >= 90 ? " full" : ""}` })),
    el("span", { class: "cache-text" }, cap
      ? `${fmt.bytes(used)} used of ${fmt.bytes(cap)}${pct !== null ? ` (${pct.toFixed(pct < 10 ? 1 : 0)} %)` : ""}`
        + (list.length ? ` · ${fmt.bytes(models.storedBytes || 0)} in ${list.length} model(s)` : "")
      : "capacity not reported"));
  // CSSOM, not a style attribute: the page's Content-Security-Policy allows no inline style.
  if (pct !== null) usage.querySelector(".fill").style.width = `${pct.toFixed(1)}%`;
  const table = list.length
    ? el("table", { class: "models" },
      el("tr", {}, el("th", {}, "model"), el("th", {}, "state"), el("th", {}, "progress"), el("th", {}, "message")),
      ...list.map(modelRow))
    : el("p", { class: "empty no-models" }, "No model cached.");
  return el("section", { class: "cache", "data-reported": "true", "data-capacity": cap, "data-used": used },
    head, usage, table);
}

function heartbeat(n, now) {
  const a = n.agent;
  if (!a) return { stale: false, badge: null };
  const silentMs = now - Date.parse(a.ts);
  const limitMs = 3 * (a.heartbeatS || 30) * 1000;
  if (silentMs > limitMs) {
    return { stale: true, badge: el("span", { class: "badge stale" }, `agent silent for ${fmt.ago(silentMs)}`) };
  }
  return { stale: false, badge: el("span", { class: "badge ok" }, "agent alive") };
}

function nodeCard(n, now) {
  const beat = heartbeat(n, now);
  const latest = latestSamples(n);
  const gpus = [];
  for (const g of (n.devices && n.devices.groups) || []) {
    for (const a of g.accelerators || []) gpus.push(gpuCard(n, g, a, latest.get(a.id)));
  }
  const agent = n.agent ? `agent ${n.agent.version}` : "no agent record";
  return el("article", { class: `node${beat.stale ? " stale" : ""}`, "data-node": n.name },
    el("h2", {}, n.name, beat.badge, el("span", { class: "meta" }, `${agent} · ${gpus.length} accelerators`)),
    el("div", { class: "gpus" }, ...gpus),
    modelsSection(n.models));
}

// -- drawing and the stream ---------------------------------------------------------------------

let drawPending = false;
function redraw() {
  if (drawPending) return;
  drawPending = true;
  requestAnimationFrame(() => { drawPending = false; draw(); });
}

function draw() {
  const now = Date.now() + view.serverSkewMs;
  const main = document.getElementById("nodes");
  const names = [...view.nodes.keys()].sort();
  const cards = names.map((name) => nodeCard(view.nodes.get(name), now));
  const empty = el("p", { class: "empty", id: "empty" },
    view.ready ? "No node has published anything yet." : "Waiting for the bus's retained state…");
  main.replaceChildren(...(cards.length ? cards : [empty]));
  const gpuCount = main.querySelectorAll(".gpu").length;
  const down = main.querySelectorAll('.gpu[data-health="unhealthy"]').length;
  document.getElementById("summary").textContent =
    `${names.length} node(s) · ${gpuCount} accelerator(s) · ${down} unhealthy`;
  const live = view.streamUp && view.busUp;
  const conn = document.getElementById("connection");
  conn.className = live ? "connected" : "disconnected";
  conn.textContent = live ? "live"
    : view.streamUp ? "disconnected: the dashboard server has lost the bus"
      : "disconnected: the dashboard server is unreachable";
  document.body.dataset.ready = String(view.ready);
}

function parse(e) {
  try { return JSON.parse(e.data); } catch (_) { return null; }
}

function connect() {
  const source = new EventSource("events");
  source.addEventListener("status", (e) => {
    const s = parse(e);
    if (!s) return;
    view.streamUp = true;
    view.busUp = !!s.connected;
    view.lastFrameAt = Date.now();
    if (s.now) view.serverSkewMs = Date.parse(s.now) - Date.now();
    redraw();
  });
  source.addEventListener("reset", () => { view.nodes.clear(); view.ready = false; redraw(); });
  source.addEventListener("bus", (e) => { apply(parse(e)); view.lastFrameAt = Date.now(); redraw(); });
  source.addEventListener("ready", () => { view.ready = true; redraw(); });
  source.onerror = () => { view.streamUp = false; redraw(); }; // EventSource retries by itself
}

setInterval(() => {
  if (view.streamUp && Date.now() - view.lastFrameAt > STATUS_SILENCE_MS) view.streamUp = false;
  redraw(); // heartbeats age even when nothing arrives
}, 1000);

connect();
