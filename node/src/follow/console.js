"use strict";
// The console at GET / (docs/OPERATIONS.md, "The console"). It follows
// GET /follow?stream=all and the status stream on one WebSocket, with the
// Rust Follower's rules (docs/PROTOCOL.md, "The follower's states"): a
// frame whose `next` the cursor covers is a duplicate; one whose `extends`
// it covers is applied; anything else is a gap, refetched from the cursor
// over GET /events; so is a heartbeat head that stays ahead of the cursor
// for `gap_ms` with nothing advancing it. The mesh picture, the writers
// table and the rates are drawn from status frames as they are pushed:
// nothing here polls.

const params = new URLSearchParams(location.search);
const GAP_MS = Number(params.get("gap_ms") || 3000);
const PAGE_LIMIT = 500;
const HISTORY_LIMIT = 50;
// The list keeps this many events; older ones leave it (History pages
// through everything).
const SHOWN_MAX = 10000;
// Rates are sampled at most this often, over the node's clock.
const SAMPLE_MS = 900;
const SAMPLES_MAX = 60;

// ---- the read secret (docs/SECURITY.md) ----
// Entered once per tab and kept in sessionStorage, never in the URL: an
// old link's `#token=SECRET` is moved there and the fragment cleared. It
// goes in a header to GET /events and, since a browser cannot set headers
// on a WebSocket, as `access_token` to GET /follow.
const SECRET_KEY = "meshlog.read_secret";
{
  const fromHash = new URLSearchParams(location.hash.slice(1)).get("token");
  if (fromHash) {
    sessionStorage.setItem(SECRET_KEY, fromHash);
    history.replaceState(null, "", location.pathname + location.search);
  }
}
function secret() { return sessionStorage.getItem(SECRET_KEY); }
function auth() {
  const s = secret();
  return s ? { headers: { authorization: "Bearer " + s } } : {};
}
async function getJson(path) {
  const response = await fetch(path, auth());
  if (response.status === 401 || response.status === 403) {
    askSecret();
    throw new Error("this node wants a read secret (" + response.status + ")");
  }
  return { status: response.status, ok: response.ok, body: await response.json() };
}
function askSecret() {
  const form = $("secret-form");
  if (!form.hidden) return;
  form.hidden = false;
  $("secret").focus();
}

function $(id) { return document.getElementById(id); }
function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}
const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}
function ago(ms) {
  if (ms === undefined || ms === null) return "never";
  if (ms < 1000) return (ms / 1000).toFixed(1) + " s";
  if (ms < 60000) return Math.round(ms / 1000) + " s";
  if (ms < 3600000) return Math.round(ms / 60000) + " min";
  return Math.round(ms / 3600000) + " h";
}

// ---- tokens (docs/TOKEN.md): version 1, varint entries, CRC-32 ----
const CRC_TABLE = (() => {
  const table = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    table[n] = c >>> 0;
  }
  return table;
})();
function crc32(bytes) {
  let c = 0xffffffff;
  for (const b of bytes) c = CRC_TABLE[(c ^ b) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}
function fromBase64Url(text) {
  const b64 = text.replace(/-/g, "+").replace(/_/g, "/");
  const raw = atob(b64 + "===".slice((b64.length + 3) % 4));
  return Uint8Array.from(raw, ch => ch.charCodeAt(0));
}
function toBase64Url(bytes) {
  let raw = "";
  for (const b of bytes) raw += String.fromCharCode(b);
  return btoa(raw).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}
// The version byte of a token's text (1, or 2: relative to a checkpoint).
function tokenVersion(text) {
  return fromBase64Url(text)[0];
}
// A token's bytes before its CRC-32, checked: version `version`, at least
// `min` bytes in all.
function tokenBody(text, version, min) {
  const bytes = fromBase64Url(text);
  if (bytes.length < min || bytes[0] !== version) throw new Error("bad token");
  const body = bytes.slice(0, bytes.length - 4);
  const view = new DataView(bytes.buffer, bytes.length - 4, 4);
  if (view.getUint32(0, true) !== crc32(body)) throw new Error("bad token checksum");
  return body;
}
// Reads LEB128 varints of `body` from byte `at` on, one a call.
function varintReader(body, at) {
  return () => {
    let value = 0n, shift = 0n;
    for (;;) {
      const b = body[at++];
      if (b === undefined) throw new Error("bad token");
      value |= BigInt(b & 0x7f) << shift;
      if (!(b & 0x80)) return value;
      shift += 7n;
    }
  };
}
// A vector is a Map from the stream id (decimal text) to its seq (BigInt).
function decodeToken(text) {
  const varint = varintReader(tokenBody(text, 1, 6), 1);
  const vector = new Map();
  const n = varint();
  let stream = -1n;
  for (let i = 0n; i < n; i++) {
    stream = i === 0n ? varint() : stream + varint() + 1n;
    vector.set(stream.toString(), varint());
  }
  return vector;
}
// A version-2 token (docs/TOKEN.md, "Version 2"): 0x02, the checkpoint's
// 16-byte name, a varint count, per stream a varint gap and a zig-zag
// difference from the checkpoint, CRC-32. Expanded with the checkpoint
// this node answers (GET /checkpoint, fetched from its peers if it lacks
// it); the page trusts its own node, as it does for every event shown.
async function expandToken(text) {
  if (tokenVersion(text) === 1) return decodeToken(text);
  const body = tokenBody(text, 2, 22);
  const name = [...body.slice(1, 17)].map(b => b.toString(16).padStart(2, "0")).join("");
  const answer = await getJson("/checkpoint?name=" + name);
  if (!answer.ok) throw new Error(answer.body.message || answer.status);
  const vector = decodeToken(answer.body.token);
  const varint = varintReader(body, 17);
  const n = varint();
  let stream = -1n;
  for (let i = 0n; i < n; i++) {
    stream = i === 0n ? varint() : stream + varint() + 1n;
    const zigzag = varint();
    const difference = zigzag & 1n ? -((zigzag + 1n) >> 1n) : zigzag >> 1n;
    const seq = (vector.get(stream.toString()) || 0n) + difference;
    if (seq < 0n) throw new Error("bad token: a seq below 0");
    if (seq === 0n) vector.delete(stream.toString());
    else vector.set(stream.toString(), seq);
  }
  return vector;
}
function encodeToken(vector) {
  const out = [1];
  const varint = (value) => {
    do {
      let b = Number(value & 0x7fn);
      value >>= 7n;
      if (value) b |= 0x80;
      out.push(b);
    } while (value);
  };
  const entries = [...vector.entries()].filter(([, seq]) => seq > 0n)
    .map(([s, seq]) => [BigInt(s), seq]).sort((a, b) => (a[0] < b[0] ? -1 : 1));
  varint(BigInt(entries.length));
  let previous = null;
  for (const [stream, seq] of entries) {
    varint(previous === null ? stream : stream - previous - 1n);
    varint(seq);
    previous = stream;
  }
  const crc = crc32(out);
  out.push(crc & 0xff, (crc >>> 8) & 0xff, (crc >>> 16) & 0xff, crc >>> 24);
  return toBase64Url(Uint8Array.from(out));
}
function covers(vector, other) {
  for (const [s, seq] of other) if ((vector.get(s) || 0n) < seq) return false;
  return true;
}
function join(vector, other) {
  for (const [s, seq] of other) if ((vector.get(s) || 0n) < seq) vector.set(s, seq);
}

function vectorText(vector) {
  return [...vector.entries()].map(([s, seq]) => s + ":" + seq).join(" ");
}

// ---- payloads: text as it is, binary as hex ----
function preview(event) {
  if (event.payload !== undefined) return { text: event.payload, hex: false };
  const bytes = Uint8Array.from(atob(event.payload_base64), ch => ch.charCodeAt(0));
  const shown = [...bytes.slice(0, 48)].map(b => b.toString(16).padStart(2, "0")).join(" ");
  return { text: "0x " + shown + (bytes.length > 48 ? " … (" + bytes.length + " bytes)" : ""), hex: true };
}
function eventItem(event, late) {
  const li = el("li");
  li.dataset.stream = event.stream;
  li.dataset.seq = event.seq;
  li.dataset.lamport = event.lamport;
  if (late) li.className = "late";
  const payload = preview(event);
  li.append(
    el("span", { class: "name" }, event.stream + ":" + event.seq),
    el("span", { class: "meta" }, " @" + event.lamport + " " + new Date(event.time).toISOString().slice(11, 23) + " "),
    el("span", { class: payload.hex ? "hex" : "text" }, payload.text));
  li.title = event.stream + ":" + event.seq + " lamport " + event.lamport + " appended " + new Date(event.time).toISOString();
  return li;
}

// ---- the follower ----
let cursor = new Map();
let shown = null;                // the highest (lamport, stream) shown
let behindSince = null;
let refetching = false;
let held = [];                   // frames that arrived during a refetch
let socket = null;
let backoffMs = 100;
let stopped = false;             // a stale cursor: waiting for the operator
let staleResume = null;
const lateByStream = new Map();
const list = $("events");

function setState(state) {
  const element = $("state");
  element.dataset.state = state;
  element.textContent = state;
}
function note(text) {
  const li = el("li", {}, new Date().toISOString() + " " + text);
  $("notes").appendChild(li);
  while ($("notes").children.length > 200) $("notes").firstChild.remove();
}
function showCursor() {
  $("cursor").value = encodeToken(cursor);
}
function filterValue() { return $("filter").value; }
function deliver(events) {
  const filter = filterValue();
  for (const event of events) {
    const seq = BigInt(event.seq);
    const have = cursor.get(event.stream) || 0n;
    if (seq <= have) continue;                     // already shown
    if (seq !== have + 1n) throw new Error("a hole before " + event.stream + ":" + event.seq);
    cursor.set(event.stream, seq);
    const key = [BigInt(event.lamport), BigInt(event.stream)];
    const late = shown !== null &&
      (key[0] < shown[0] || (key[0] === shown[0] && key[1] < shown[1]));
    if (!late) shown = key;
    else lateByStream.set(event.stream, (lateByStream.get(event.stream) || 0) + 1);
    const li = eventItem(event, late);
    if (filter && event.stream !== filter) li.classList.add("hidden");
    list.appendChild(li);
    addFilterOption(event.stream);
    behindSince = null;
  }
  while (list.children.length > SHOWN_MAX) list.firstChild.remove();
  $("shown-count").textContent = list.querySelectorAll("li:not(.hidden)").length;
  showCursor();
}

async function refetch(reason) {
  if (refetching || stopped) return;
  refetching = true;
  setState("refetching");
  try {
    for (;;) {
      const answer = await getJson("/events?limit=" + PAGE_LIMIT + "&after=" + encodeToken(cursor));
      if (answer.status === 410) { stale(answer.body); break; }
      if (!answer.ok) throw new Error(answer.body.message || answer.status);
      deliver(answer.body.events);
      // `next` is the cursor joined with the page, which deliver() has
      // made already; a version-2 token (a checkpoint's name and the
      // differences from it, which a node answers where it is shorter)
      // names a vector this page does not hold, and is not read.
      if (tokenVersion(answer.body.next) === 1) join(cursor, decodeToken(answer.body.next));
      showCursor();
      if (answer.body.at_head) break;
    }
    if (!stopped) note("gap refetched (" + reason + ")");
  } catch (error) {
    note("refetch failed: " + error.message);
    if (socket) socket.close();
  } finally {
    refetching = false;
    behindSince = null;
    if (!stopped) setState("live");
    const frames = held;
    held = [];
    for (const frame of frames) onFrame(frame);
  }
}

// A stale cursor: the follow stops, and the page shows what was lost and
// offers the token that accepts exactly that loss.
function stale(body) {
  stopped = true;
  staleResume = body.resume;
  setState("stale");
  const lost = $("lost");
  lost.replaceChildren();
  for (const range of body.lost) {
    const count = range.last - range.first + 1;
    const li = el("li", {}, "stream " + range.stream + ": seq " + range.first + " to " + range.last
      + " (" + count + (count === 1 ? " event)" : " events)"));
    li.dataset.stream = range.stream;
    li.dataset.first = range.first;
    li.dataset.last = range.last;
    lost.appendChild(li);
  }
  $("stale-message").textContent = body.message || "";
  $("stale").hidden = false;
  $("stale-resume").focus();
  note("stale: lost " + body.lost.map(r => r.stream + ":" + r.first + "-" + r.last).join(", "));
  closeSocket();
}

function onFrame(frame) {
  if (frame.type === "status") { onStatus(frame); return; }
  if (stopped) return;
  if (refetching) { held.push(frame); return; }
  switch (frame.type) {
    case "events": {
      if (frame.stream !== "all") return;
      const next = decodeToken(frame.next);
      if (covers(cursor, next)) return;            // a duplicate
      if (covers(cursor, decodeToken(frame.extends))) {
        deliver(frame.events);
        join(cursor, next);
        showCursor();
      } else {
        refetch("a frame past a hole");
      }
      break;
    }
    case "heartbeat": {
      if (frame.stream !== "all") return;
      if (covers(cursor, decodeToken(frame.head))) behindSince = null;
      else if (behindSince === null) behindSince = Date.now();
      break;
    }
    case "lagged":
      note("lagged: paging from the cursor, then following again");
      refetch("lagged").then(() => { if (socket) socket.close(); });
      break;
    case "stale":
      stale(frame);
      break;
    case "error":
      note("error: " + frame.message);
      break;
  }
}

function closeSocket() {
  const ws = socket;
  socket = null;
  if (ws) ws.close();
}
function connect() {
  if (stopped) return;
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const s = secret();
  const url = scheme + "//" + location.host + "/follow?stream=all&after=" + encodeToken(cursor)
    + (s ? "&access_token=" + encodeURIComponent(s) : "");
  const ws = new WebSocket(url);
  socket = ws;
  let opened = false;
  ws.onopen = () => {
    opened = true;
    setState("live");
    backoffMs = 100;
    ws.send(JSON.stringify({ type: "subscribe", stream: "status" }));
  };
  ws.onmessage = (message) => { if (socket === ws) onFrame(JSON.parse(message.data)); };
  ws.onclose = () => {
    if (socket !== ws) return;
    socket = null;
    setState("reconnecting");
    // A refused upgrade never opens: ask whether a secret is wanted.
    if (!opened) getJson("/marks").catch(() => {});
    setTimeout(connect, backoffMs);
    backoffMs = Math.min(backoffMs * 2, 5000);
  };
}

// Follows from `vector` afresh: the list restarts there.
function restart(vector) {
  closeSocket();
  cursor = vector;
  shown = null;
  held = [];
  behindSince = null;
  stopped = false;
  staleResume = null;
  lateByStream.clear();
  list.replaceChildren();
  $("shown-count").textContent = "0";
  $("stale").hidden = true;
  $("lost").replaceChildren();
  showCursor();
  setState("connecting");
  connect();
}

// ---- the status stream: mesh, writers, rates ----
let samples = [];                // {time_ms, appended, received, heads: Map}
let rates = { appended: [], received: [], streams: new Map() };
let nodeId = null;

// A status frame comes on every change of the replica: under load, many a
// second. Each is sampled for the rates; the page is drawn from the latest
// at most every DRAW_MS.
const DRAW_MS = 100;
let latestStatus = null;
let drawTimer = null;
function onStatus(frame) {
  sample(frame);
  latestStatus = frame;
  if (drawTimer === null) drawTimer = setTimeout(drawStatus, DRAW_MS);
}
function drawStatus() {
  drawTimer = null;
  const frame = latestStatus;
  nodeId = frame.node;
  $("node-id").textContent = frame.node;
  $("status").textContent = JSON.stringify(frame, null, 2);
  $("updated").textContent = "status at " + new Date(frame.time_ms || Date.now()).toISOString().slice(11, 23);
  drawMesh(frame);
  drawLinks(frame);
  drawWriters(frame);
  drawRates();
}

function sample(frame) {
  if (!frame.time_ms) return;
  const heads = new Map((frame.writers || []).map(w => [w.stream, w.head]));
  const last = samples[samples.length - 1];
  if (last && frame.time_ms - last.time_ms < SAMPLE_MS) return;
  samples.push({ time_ms: frame.time_ms, appended: frame.appended, received: frame.received, heads });
  if (!last) return;
  if (samples.length > 2) samples.shift();
  const seconds = (frame.time_ms - last.time_ms) / 1000;
  const push = (series, value) => {
    series.push(Math.max(0, value / seconds));
    if (series.length > SAMPLES_MAX) series.shift();
  };
  push(rates.appended, frame.appended - last.appended);
  push(rates.received, frame.received - last.received);
  for (const [stream, head] of heads) {
    if (!rates.streams.has(stream)) rates.streams.set(stream, []);
    push(rates.streams.get(stream), head - (last.heads.get(stream) || 0));
  }
}

function sparkPoints(series, width, height) {
  if (series.length === 0) return "";
  // One sample is drawn as a step, so that it shows.
  if (series.length === 1) series = [0, series[0]];
  const top = Math.max(1, ...series);
  const step = width / (SAMPLES_MAX - 1);
  const offset = (SAMPLES_MAX - series.length) * step;
  return series.map((v, i) => (offset + i * step).toFixed(1) + "," + (height - 1 - (v / top) * (height - 2)).toFixed(1)).join(" ");
}
function rateText(series) {
  const v = series.length ? series[series.length - 1] : 0;
  return v >= 10 ? v.toFixed(0) : v.toFixed(1);
}
function drawRates() {
  for (const name of ["appended", "received"]) {
    $("rate-" + name).textContent = rateText(rates[name]);
    $("spark-" + name).querySelector("polyline").setAttribute("points", sparkPoints(rates[name], 240, 48));
  }
}

const STATE_TEXT = { up: "up", limit: "limit hit", connecting: "connecting", reconnecting: "down, redialing", refused: "refused" };

function drawMesh(frame) {
  const links = frame.links || [];
  const width = 560, height = 340, cx = width / 2, cy = height / 2;
  const radius = links.length ? 125 : 0;
  const linkLayer = $("mesh-links"), nodeLayer = $("mesh-nodes");
  linkLayer.replaceChildren();
  nodeLayer.replaceChildren();
  links.forEach((link, i) => {
    // The first peer to the left, the others around: labels sit on
    // lines that are more across than up.
    const angle = Math.PI + (2 * Math.PI * i) / links.length;
    const x = cx + radius * Math.cos(angle) * 1.45, y = cy + radius * Math.sin(angle);
    const g = svg("g", { class: "link", "data-peer": link.peer, "data-direction": link.direction,
      "data-state": link.state, "data-lag": link.lag_events, "data-stream": link.stream || "" });
    g.appendChild(svg("title", {}, link.peer + " (" + link.direction + "): " + STATE_TEXT[link.state]
      + (link.reason ? " — " + link.reason : "")));
    g.appendChild(svg("line", { x1: cx, y1: cy, x2: x, y2: y }));
    const mx = cx + (x - cx) * 0.58, my = cy + (y - cy) * 0.58;
    g.appendChild(svg("text", { x: mx, y: my - 4 }, "lag " + link.lag_events + " · " + ago(link.exchange_age_ms)));
    if (link.state !== "up") g.appendChild(svg("text", { x: mx, y: my + 11 }, STATE_TEXT[link.state] || link.state));
    linkLayer.appendChild(g);
    const peer = svg("g", { class: "node peer", "data-peer": link.peer });
    peer.appendChild(svg("circle", { cx: x, cy: y, r: 24 }));
    peer.appendChild(svg("text", { x, y: y + 4 }, link.stream ? "#" + link.stream : "?"));
    peer.appendChild(svg("text", { x, y: y + (y < cy ? -30 : 40) }, link.peer + (link.direction === "inbound" ? " (in)" : "")));
    nodeLayer.appendChild(peer);
  });
  const self = svg("g", { class: "node self" });
  self.appendChild(svg("circle", { cx, cy, r: 30 }));
  self.appendChild(svg("text", { x: cx, y: cy + 4 }, "#" + frame.node));
  self.appendChild(svg("text", { x: cx, y: cy - 38 }, "this node"));
  nodeLayer.appendChild(self);
}

function drawLinks(frame) {
  const body = $("links").tBodies[0];
  body.replaceChildren();
  for (const link of frame.links || []) {
    const tr = el("tr");
    tr.dataset.peer = link.peer;
    tr.dataset.state = link.state;
    tr.append(el("td", { class: "mono" }, link.peer), el("td", {}, link.stream || "?"),
      el("td", {}, link.direction),
      el("td", { class: "state-" + link.state, title: link.reason || "" },
        (STATE_TEXT[link.state] || link.state) + (link.reason ? ": " + link.reason : "")),
      el("td", { class: "num" }, String(link.lag_events)),
      el("td", { class: "num" }, ago(link.exchange_age_ms)));
    body.appendChild(tr);
  }
  if (!(frame.links || []).length) {
    const tr = el("tr");
    tr.appendChild(el("td", { colspan: 6, class: "caption" }, "no links: add one with POST /peers or --peer"));
    body.appendChild(tr);
  }
}

function drawWriters(frame) {
  const body = $("writers").tBodies[0];
  body.replaceChildren();
  const now = frame.time_ms || Date.now();
  for (const writer of frame.writers || []) {
    const tr = el("tr");
    tr.dataset.stream = writer.stream;
    if (writer.stream === frame.node) tr.className = "own";
    const cell = (name, text, cls) => {
      const td = el("td", cls ? { class: cls } : {}, text);
      td.dataset.col = name;
      return td;
    };
    const series = rates.streams.get(writer.stream) || [];
    const spark = svg("svg", { class: "spark", viewBox: "0 0 120 24", preserveAspectRatio: "none", "aria-hidden": "true" });
    spark.appendChild(svg("polyline", { points: sparkPoints(series, 120, 24) }));
    const chart = cell("chart", "");
    chart.appendChild(spark);
    tr.append(cell("stream", writer.stream),
      cell("head", String(writer.head), "num"),
      cell("floor", String(writer.floor), "num"),
      cell("held", String(writer.held), "num"),
      cell("last", writer.last_time_ms ? ago(Math.max(0, now - writer.last_time_ms)) + " ago" : "none held"),
      cell("rate", rateText(series), "num"),
      chart,
      cell("late", String(lateByStream.get(writer.stream) || 0), "num"));
    body.appendChild(tr);
    addFilterOption(writer.stream);
  }
}

function addFilterOption(stream) {
  const select = $("filter");
  if ([...select.options].some(o => o.value === stream)) return;
  const label = stream + (stream === nodeId ? " (this node)" : "");
  select.appendChild(el("option", { value: stream }, label));
}

// ---- history: pages of the log after any token ----
let historyStack = [];           // the tokens of the pages before this one
let historyAt = null, historyNext = null;
async function readHistory(token) {
  const answer = await getJson("/events?limit=" + HISTORY_LIMIT + "&after=" + encodeURIComponent(token));
  const out = $("history");
  if (answer.status === 410) {
    out.replaceChildren();
    $("history-state").textContent = "stale: lost " + answer.body.lost.map(r => r.stream + ":" + r.first + "-" + r.last).join(", ")
      + "; the page from the floor is at " + answer.body.resume;
    $("history-token").value = answer.body.resume;
    return false;
  }
  if (!answer.ok) { $("history-state").textContent = "refused: " + (answer.body.message || answer.status); return false; }
  out.replaceChildren(...answer.body.events.map(e => eventItem(e, false)));
  historyAt = token;
  historyNext = answer.body.next;
  $("history-state").textContent = answer.body.events.length + " events after " + (token || "the start")
    + (answer.body.at_head ? " (at the head)" : "") + "; next page from " + answer.body.next;
  $("history-next").disabled = answer.body.at_head;
  $("history-previous").disabled = historyStack.length === 0;
  return true;
}

// ---- controls ----
$("copy").addEventListener("click", async () => {
  const input = $("cursor");
  try { await navigator.clipboard.writeText(input.value); note("token copied"); }
  catch { input.select(); document.execCommand("copy"); note("token selected and copied"); }
});
$("resume-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const text = $("resume-token").value.trim();
  let vector;
  try { vector = text ? await expandToken(text) : new Map(); }
  catch (error) { note("not a token: " + error.message); return; }
  note("resuming from " + (text || "the start"));
  restart(vector);
});
$("stale-resume").addEventListener("click", async () => {
  if (staleResume === null) return;
  const vector = new Map(cursor);
  // A refetch's 410 offers the shortest token (version 2 where shorter).
  try { join(vector, await expandToken(staleResume)); }
  catch (error) { note("cannot resume: " + error.message); return; }
  note("resumed from the floor, accepting the gap");
  restart(vector);
});
$("filter").addEventListener("change", () => {
  const filter = filterValue();
  for (const li of list.children) li.classList.toggle("hidden", filter !== "" && li.dataset.stream !== filter);
  $("shown-count").textContent = list.querySelectorAll("li:not(.hidden)").length;
});
$("history-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  historyStack = [];
  await readHistory($("history-token").value.trim()).catch(error => note(error.message));
});
$("history-next").addEventListener("click", async () => {
  if (historyNext === null) return;
  const at = historyAt;
  if (await readHistory(historyNext).catch(error => { note(error.message); return false; })) historyStack.push(at);
  $("history-previous").disabled = historyStack.length === 0;
});
$("history-previous").addEventListener("click", async () => {
  if (!historyStack.length) return;
  const token = historyStack.pop();
  await readHistory(token).catch(error => note(error.message));
  $("history-previous").disabled = historyStack.length === 0;
});
$("secret-show").addEventListener("click", askSecret);
$("secret-form").addEventListener("submit", (e) => {
  e.preventDefault();
  sessionStorage.setItem(SECRET_KEY, $("secret").value);
  $("secret").value = "";
  $("secret-form").hidden = true;
  note("read secret kept for this tab");
  closeSocket();
  connect();
});

setInterval(() => {
  if (behindSince !== null && Date.now() - behindSince > GAP_MS) refetch("a silent tail");
}, 50);
showCursor();
connect();
