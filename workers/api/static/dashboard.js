// Polar dashboard: one snapshot from /rollout/status, then every change from /events (Server-Sent Events).
// Same-origin only; the token travels as the cookie the server set when the page was opened with ?token=.
"use strict";

// `chosen`: the batch whose samples are listed; it follows the newest batch until the user clicks one (`pinned`).
const state = { batches: {}, seen: {}, samples: {}, harness: {}, rewards: {}, nodes: [], chosen: null, pinned: false,
                lastCounters: null };

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = text;
  if (cls) e.className = cls;
  return e;
}

function fmt(x) { return x === null || x === undefined ? "-" : Number(x).toFixed(3); }

function taskOf(batchId, sampleId) {  // sample ids are <batch>.<task>.<k>
  return sampleId.slice(batchId.length + 1, sampleId.lastIndexOf("."));
}

async function getJSON(path) {
  const answer = await fetch(path, { credentials: "same-origin" });
  if (!answer.ok) throw new Error(path + ": HTTP " + answer.status);
  return answer.json();
}

const loading = {};

function loadBatch(batchId) {  // once per batch: its snapshot already holds the state of any event that led here
  if (!loading[batchId]) loading[batchId] = fetchBatch(batchId).finally(() => { delete loading[batchId]; });
  return loading[batchId];
}

async function fetchBatch(batchId) {
  const data = await getJSON("/api/batches/" + encodeURIComponent(batchId));
  state.batches[batchId] = data.progress;
  state.harness[batchId] = data.adapter || "(per task)";
  state.samples[batchId] = data.samples;
  for (const [sid, st] of Object.entries(data.samples)) countReward(batchId, sid, st);
  render();
}

function countReward(batchId, sampleId, st) {
  if (st.stage !== "done" || st.reward === null || st.reward === undefined) return;
  const key = taskOf(batchId, sampleId) + "\u0000" + (state.harness[batchId] || "?");
  const seen = state.rewards[key] || { n: 0, sum: 0, ids: {} };
  if (seen.ids[sampleId]) return;
  seen.ids[sampleId] = true; seen.n += 1; seen.sum += Number(st.reward);
  state.rewards[key] = seen;
}

function recount(batchId) {  // a batch's progress from its samples' stages, as workers/batches.py counts it
  const p = state.batches[batchId];
  const samples = Object.values(state.samples[batchId] || {});
  if (!p || !samples.length) return;
  const count = { queued: 0, done: 0, masked: 0, cancelled: 0 };
  const rewards = [];
  for (const st of samples) {
    if (st.stage in count) count[st.stage] += 1;
    if (st.stage === "done" && st.reward !== null && st.reward !== undefined) rewards.push(Number(st.reward));
  }
  Object.assign(p, count);
  p.running = samples.length - count.queued - count.done - count.masked - count.cancelled;
  p.reward_mean = rewards.length ? rewards.reduce((a, b) => a + b, 0) / rewards.length : null;
}

function follow(batchId) {  // the newest batch by id (ids sort by time), as start() chose; a late event of an old one is not
  if (!state.pinned && (!state.chosen || batchId > state.chosen)) state.chosen = batchId;
}

function onSample(ev) {
  const b = ev.batch_id;
  if (!state.batches[b]) { follow(b); return loadBatch(b); }
  const samples = state.samples[b] = state.samples[b] || {};
  samples[ev.sample_id] = Object.assign(samples[ev.sample_id] || {}, { stage: ev.stage, node: ev.node, reward: ev.reward });
  countReward(b, ev.sample_id, samples[ev.sample_id]);
  recount(b);
  render();
}

function onGroup(ev) {
  const p = state.batches[ev.batch_id];
  if (p) { p.groups_done = ev.groups_done; render(); }
}

function onBatch(ev) {
  const p = state.batches[ev.batch_id];
  if (!p) { follow(ev.batch_id); return loadBatch(ev.batch_id); }
  p.status = ev.status;
  render();
}

function onHeartbeat(ev) {
  setFence(ev.fence.paused);
  state.nodes = ev.nodes;
  const c = ev.counters || {};
  if (state.lastCounters) {
    const dt = ev.time - state.lastCounters.time;
    const calls = (c.calls || 0) - (state.lastCounters.calls || 0);
    if (dt > 0) document.getElementById("rate").textContent = "LLM calls/s: " + (calls / dt).toFixed(2);
  }
  state.lastCounters = Object.assign({ time: ev.time }, c);
  if (ev.sample_latency_s !== undefined && ev.sample_latency_s !== null)
    document.getElementById("latency").textContent = "sample latency: " + ev.sample_latency_s.toFixed(1) + " s";
  render();
}

function setFence(paused) {
  const f = document.getElementById("fence");
  f.textContent = "fence: " + (paused ? "PAUSED" : "running");
  f.className = "pill" + (paused ? " paused" : "");
}

function bar(p) {  // green only for a batch that ran every sample; cancelled samples are a grey part of their own
  const finished = p.done + p.masked + p.cancelled;
  const look = p.status === "running" ? "" : p.status === "completed" && !p.cancelled ? " done" : " stopped";
  const wrap = el("span", null, "bar" + look);
  const part = (n, cls) => {
    const fill = el("span", null, cls);
    fill.style.width = (p.total ? 100 * n / p.total : 0) + "%";
    wrap.appendChild(fill);
  };
  part(p.done + p.masked, "ran");
  part(p.cancelled, "cancelled");
  const cell = el("td");
  cell.appendChild(wrap);
  cell.appendChild(el("span", " " + finished + "/" + p.total, "progress-text"));
  return cell;
}

function renderBatches() {
  const body = document.querySelector("#batches tbody");
  body.replaceChildren();
  const ids = Object.keys(state.batches).sort().reverse();
  for (const b of ids) {
    const p = state.batches[b];
    const tr = el("tr");
    tr.dataset.batch = b;
    tr.dataset.status = p.status;
    const now = (p.done + p.masked + p.cancelled) + "/" + p.total + " " + p.status;
    const seen = state.seen[b] = state.seen[b] || [];  // the progress this page has shown, oldest first
    if (seen[seen.length - 1] !== now) seen.push(now);
    tr.dataset.seen = seen.join("|");
    if (b === state.chosen) tr.className = "chosen";
    tr.appendChild(el("td", b));
    tr.appendChild(el("td", state.harness[b] || ""));
    tr.appendChild(el("td", p.status, "status"));
    tr.appendChild(bar(p));
    for (const k of ["queued", "running", "done", "masked", "cancelled"]) tr.appendChild(el("td", p[k]));
    tr.appendChild(el("td", p.groups_done + "/" + p.groups));
    tr.appendChild(el("td", fmt(p.reward_mean)));
    tr.onclick = () => {
      state.chosen = b; state.pinned = true;
      if (!state.samples[b]) loadBatch(b).catch(() => null);  // beyond the ten the page loaded at start
      render();
    };
    body.appendChild(tr);
  }
}

function renderRewards() {
  const body = document.querySelector("#rewards tbody");
  body.replaceChildren();
  for (const key of Object.keys(state.rewards).sort()) {
    const [task, harness] = key.split("\u0000");
    const r = state.rewards[key];
    const tr = el("tr");
    for (const v of [task, harness, r.n, fmt(r.sum / r.n)]) tr.appendChild(el("td", v));
    body.appendChild(tr);
  }
}

function renderNodes() {
  const body = document.querySelector("#nodes tbody");
  body.replaceChildren();
  for (const n of state.nodes) {
    const tr = el("tr");
    for (const v of [n.node, n.state, n.load]) tr.appendChild(el("td", v));
    body.appendChild(tr);
  }
}

function renderSamples() {
  const body = document.querySelector("#samples tbody");
  body.replaceChildren();
  const b = state.chosen;
  document.getElementById("selected").textContent = b ? "of " + b : "";
  if (!b) return;
  for (const [sid, st] of Object.entries(state.samples[b] || {}).sort()) {
    const tr = el("tr");
    tr.appendChild(el("td", sid));
    tr.appendChild(el("td", st.stage, "stage-" + st.stage));
    tr.appendChild(el("td", st.node || ""));
    tr.appendChild(el("td", fmt(st.reward)));
    const link = el("a", "polar report");
    link.href = "/api/batches/" + encodeURIComponent(b) + "/report#" + encodeURIComponent(sid);
    const cell = el("td"); cell.appendChild(link); tr.appendChild(cell);
    body.appendChild(tr);
  }
}

function render() { renderBatches(); renderRewards(); renderNodes(); renderSamples(); }

async function start() {
  const snapshot = await getJSON("/rollout/status");
  setFence(snapshot.fence.paused);
  state.nodes = snapshot.nodes;
  for (const b of snapshot.batches) {
    state.batches[b.batch_id] = b.progress;
  }
  state.chosen = Object.keys(state.batches).sort().reverse()[0] || null;  // newest first, as the table lists them
  render();
  await Promise.all(snapshot.batches.slice(0, 10).map(b => loadBatch(b.batch_id).catch(() => null)));
  // From the snapshot's stream position: whatever changed since the snapshot arrives as events.
  const source = new EventSource("/events?after=" + encodeURIComponent(snapshot.events_after));
  const stream = document.getElementById("stream");
  source.addEventListener("hello", () => { stream.textContent = "events: live"; stream.className = "pill live"; });
  source.addEventListener("sample", e => onSample(JSON.parse(e.data)));
  source.addEventListener("group", e => onGroup(JSON.parse(e.data)));
  source.addEventListener("batch", e => onBatch(JSON.parse(e.data)));
  source.addEventListener("fence", e => setFence(JSON.parse(e.data).paused));
  source.addEventListener("heartbeat", e => onHeartbeat(JSON.parse(e.data)));
  source.onerror = () => { stream.textContent = "events: reconnecting"; stream.className = "pill"; };
}

start().catch(e => { document.getElementById("stream").textContent = "error: " + e.message; });
