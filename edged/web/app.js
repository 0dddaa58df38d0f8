// edged's status page. It reads the daemon's own read-only endpoints (GET only, relative
// URLs, nothing from anywhere else) and draws them: the status report every POLL_MS, the
// recent events, and each stream's annotated live view (MJPEG, or a picture a second when the
// stream's viewers are all taken).
"use strict";

const POLL_MS = 2000;
const LIVE_HEIGHT = 360;
const EVENTS_SHOWN = 12;
const PICTURE_EVERY_MS = 1000;

const edged = { status: null, cards: new Map(), eventsKey: "" };
window.edged = edged;

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === null || value === undefined) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child !== null && child !== undefined) node.append(child);
  }
  return node;
}

async function getJSON(path) {
  const response = await fetch(path, { cache: "no-store" });
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return response.json();
}

const enc = encodeURIComponent;
const num = (value, digits = 1) =>
  value === null || value === undefined || Number.isNaN(value) ? "–" : Number(value).toFixed(digits);

function count(value) {
  if (value === null || value === undefined) return "–";
  if (value >= 1e6) return `${(value / 1e6).toFixed(1)}M`;
  if (value >= 1e4) return `${(value / 1e3).toFixed(1)}k`;
  return String(value);
}

function duration(seconds) {
  seconds = Math.floor(seconds || 0);
  if (seconds < 120) return `${seconds} s`;
  if (seconds < 7200) return `${Math.floor(seconds / 60)} min`;
  return `${Math.floor(seconds / 3600)} h ${Math.floor((seconds % 3600) / 60)} min`;
}

function ago(ts) {
  if (!ts) return "";
  return `${duration(Math.max(0, Date.now() / 1000 - ts))} ago`;
}

function clock(ts) {
  return ts ? new Date(ts * 1000).toLocaleTimeString() : "";
}

function stateClass(state) {
  return `state-${String(state || "").toLowerCase()}`;
}

// -- header -------------------------------------------------------------------------------
function drawHeader(s) {
  document.getElementById("device").textContent = `${s.device_id} · ${s.version}`;
  const health = document.getElementById("health");
  const good = s.live && s.ready;
  health.textContent = !s.live ? "STUCK" : s.ready ? "ready" : "not ready";
  health.className = `pill ${good ? "ok" : "bad"}`;
  health.title = (s.problems || []).join("\n");
  const ready = (s.models || []).filter((m) => m.state === "READY").length;
  const streams = Object.values(s.streams || {});
  const up = streams.filter((r) => r.state === "streaming").length;
  const mqtt = s.mqtt ? (s.mqtt.connected ? "broker connected" : "broker unreachable") : "MQTT off";
  document.getElementById("summary").textContent =
    `up ${duration(s.uptime_s)} · ${ready} model(s) ready · streams ${up}/${streams.length} up · ${mqtt}`;
  document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
}

// -- streams ------------------------------------------------------------------------------
function liveBase(name) {
  return `/v2/edged/streams/${enc(name)}/`;
}

function startLive(card) {
  const img = card.img;
  if (!img || document.hidden) return;
  clearTimeout(card.timer);
  card.mode = "mjpeg";
  img.onload = null;
  img.onerror = () => {
    // Every viewer of the stream is taken (503), or the stream is restarting: fall back to
    // one picture a second.
    if (card.mode === "mjpeg") {
      card.mode = "picture";
      nextPicture(card);
    }
  };
  img.src = `${liveBase(card.name)}live.mjpeg?h=${LIVE_HEIGHT}&t=${Date.now()}`;
}

function nextPicture(card) {
  const img = card.img;
  img.onload = img.onerror = () => {
    card.timer = setTimeout(() => nextPicture(card), PICTURE_EVERY_MS);
  };
  img.src = `${liveBase(card.name)}latest.jpg?h=${LIVE_HEIGHT}&t=${Date.now()}`;
}

function stopLive(card) {
  clearTimeout(card.timer);
  if (card.img) {
    card.img.onload = card.img.onerror = null;
    card.img.removeAttribute("src"); // closes the MJPEG connection
  }
  card.mode = null;
}

const STREAM_FIELDS = [
  ["fps", "fps", (r) => num(r.fps)],
  ["processed", "processed", (r) => count(r.processed)],
  ["skipped", "skipped", (r) => count(r.skipped)],
  ["gated", "gated", (r) => (r.gated === undefined ? "–" : count(r.gated))],
  ["dropped", "dropped", (r) => count(r.dropped)],
  ["reconnects", "reconnects", (r) => count(r.reconnects)],
  ["failed", "failed", (r) => count(r.failed)],
  ["latency", "latency p50/p99 ms",
   (r) => (r.latency_ms ? `${num(r.latency_ms.p50)}/${num(r.latency_ms.p99)}` : "–")],
];

function makeCard(name, row) {
  const card = { name, fields: {}, mode: null, timer: null, running: row.running_s };
  const state = el("span", { class: "state" });
  const title = el("h3", {}, el("span", { text: name }),
                   el("span", { class: "model muted", text: row.model }), state);
  card.state = state;
  let view;
  if (row.picture) {
    card.img = el("img", { class: "live", alt: `${name}: live view` });
    view = card.img;
  } else {
    view = el("div", { class: "nopicture muted", text: "no picture (a sensor stream)" });
  }
  const stats = el("div", { class: "stats" });
  for (const [key, label] of STREAM_FIELDS) {
    const value = el("b", { text: "–" });
    card.fields[key] = value;
    stats.append(el("div", {}, el("span", { text: label }), value));
  }
  card.objects = el("span", { class: "objects muted" });
  const foot = el("div", { class: "foot" }, card.objects);
  if (row.picture) {
    foot.append(el("button", {
      type: "button", text: "zones & lines",
      onclick: () => window.edgedHelper && window.edgedHelper.open(name),
    }));
  }
  card.root = el("div", { class: "card", "data-stream": name }, title, view, stats, foot);
  return card;
}

function describeObjects(row) {
  const parts = [];
  const objects = Object.entries(row.objects || {}).filter(([, n]) => n > 0);
  parts.push(objects.length ? objects.map(([label, n]) => `${label} ${n}`).join(", ")
                            : row.objects ? "no objects" : "");
  const last = row.last_event;
  if (last) {
    parts.push(`last: ${last.type} ${last.label}${last.zones && last.zones.length
      ? ` (${last.zones.join(", ")})` : ""} ${ago(last.time)}`);
  } else if (row.last_result) {
    parts.push(row.last_result);
  }
  return parts.filter(Boolean).join(" · ");
}

function drawStreams(streams) {
  const box = document.getElementById("streams");
  const names = Object.keys(streams).sort();
  if (!names.length) {
    box.replaceChildren(el("p", { class: "muted", text: "no streams" }));
    for (const card of edged.cards.values()) stopLive(card);
    edged.cards.clear();
    return;
  }
  for (const [name, card] of edged.cards) {
    if (!(name in streams)) {
      stopLive(card);
      card.root.remove();
      edged.cards.delete(name);
    }
  }
  box.querySelector(":scope > p")?.remove();
  for (const name of names) {
    const row = streams[name];
    let card = edged.cards.get(name);
    if (!card) {
      card = makeCard(name, row);
      edged.cards.set(name, card);
      box.append(card.root);
      startLive(card);
    } else if (row.running_s < card.running) {
      startLive(card); // restarted (a reload): connect again
    }
    card.running = row.running_s;
    card.state.textContent = row.state;
    card.state.className = `state ${stateClass(row.state)}`;
    for (const [key, , show] of STREAM_FIELDS) card.fields[key].textContent = show(row);
    card.objects.textContent = describeObjects(row);
  }
}

document.addEventListener("visibilitychange", () => {
  // A hidden tab watches nothing: the device draws nothing for it.
  for (const card of edged.cards.values()) {
    if (document.hidden) stopLive(card);
    else startLive(card);
  }
});

// -- models -------------------------------------------------------------------------------
function drawModels(s) {
  const body = document.querySelector("#models tbody");
  const rows = [];
  const queues = s.queues || {};
  for (const m of s.models || []) {
    const key = `${m.name}:${m.version}`;
    const stats = (s.inference || {})[key] || {};
    let waiting = 0;
    let running = 0;
    let instances = null;
    for (const label of [m.name, key]) {
      const q = queues[label];
      if (q && (label === key || m.state === "READY")) {
        waiting += q.queued;
        running += q.pending - q.queued;
        instances = Math.max(instances || 0, q.instances || 0);
      }
    }
    const provider = (m.providers || []).join(", ") || m.reason || "";
    rows.push(el("tr", { "data-model": key },
      el("td", { text: key }),
      el("td", { class: stateClass(m.state), text: m.state }),
      el("td", { text: `${m.backend || "–"}${provider ? ` · ${provider}` : ""}` }),
      el("td", { text: m.precision || "–" }),
      el("td", { text: m.device || "–" }),
      el("td", { text: instances ?? "–" }),
      el("td", { text: `${waiting} waiting, ${running} running` }),
      el("td", { text: stats.p50_ms === undefined ? "–" : `${num(stats.p50_ms, 2)} / ${num(stats.p99_ms, 2)}` }),
      el("td", { text: count(stats.success) }),
      el("td", { text: count((stats.failure || 0) + (stats.rejected || 0)) })));
  }
  body.replaceChildren(...rows);
}

// -- events -------------------------------------------------------------------------------
function drawEvents(events) {
  const box = document.getElementById("events");
  const shown = events.slice(0, EVENTS_SHOWN);
  const key = shown.map((e) => `${e.type}:${e.object.id}:${e.object.has_snapshot}:${e.object.has_plate_snapshot}:${e.object.recognized_license_plate}:${e.object.clip ? e.object.clip.id : ""}:${e.description ? e.description.state : ""}`).join("|");
  if (key === edged.eventsKey) return; // unchanged: keep the pictures as they are
  edged.eventsKey = key;
  if (!shown.length) {
    box.replaceChildren(el("p", { class: "muted", text: "no events yet" }));
    return;
  }
  box.replaceChildren(...shown.map((e) => {
    const o = e.object;
    const picture = o.has_snapshot
      ? el("img", { src: `/v2/edged/snapshots/${enc(o.id)}?t=${Math.floor(e.time)}`,
                    alt: `${o.label} ${o.id}`, class: "snapshot", loading: "lazy" })
      : el("div", { class: "nopicture muted", text: "no snapshot" });
    const zones = o.entered_zones && o.entered_zones.length ? `zones: ${o.entered_zones.join(", ")}` : "";
    // The event's clip (recording.md): written post_capture_s after the end, so nothing is
    // fetched until it is played.
    const clip = o.clip
      ? el("video", { class: "clip", controls: "", preload: "none", src: o.clip.url,
                      "data-clip": o.clip.id, title: `clip ${o.clip.id}, ${num(o.clip.duration, 1)} s` })
      : null;
    // Its description (events.md#descriptions), once the describer has answered: the
    // summary's title, its short summary on hover.
    // Its licence plate as read (events.md#licence-plates): the plate's own picture, the
    // best read of the voted plate, beside the text.
    const plate = o.recognized_license_plate
      ? el("div", { class: "plate" },
          o.has_plate_snapshot
            ? el("img", { src: `/v2/edged/snapshots/${enc(o.id)}/plate?t=${Math.floor(e.time)}`,
                          alt: `plate ${o.recognized_license_plate}`, class: "platepicture",
                          loading: "lazy" })
            : null,
          el("span", { class: "platetext", text: o.recognized_license_plate }))
      : null;
    const d = e.description;
    const said = d && d.state === "described" && d.summary
      ? el("div", { class: "description", text: d.summary.title, title: d.summary.shortSummary })
      : null;
    return el("div", { class: "event", "data-id": o.id, "data-type": e.type }, picture,
      el("div", { class: "what", text: `${e.type} ${o.label}${o.sub_label ? ` (${o.sub_label})` : ""}` }),
      el("div", { class: "muted", text: `${o.stream} · ${num(o.top_score, 2)} · ${clock(e.time)}` }),
      zones ? el("div", { text: zones }) : null, plate, said, clip);
  }));
}

// -- updates, device, warnings --------------------------------------------------------------
function drawUpdates(s) {
  const box = document.getElementById("ota");
  const updates = Object.entries(s.updates || {});
  const shadows = (s.ota && s.ota.shadows) || {};
  const parts = [];
  if (s.ota) {
    parts.push(el("p", { class: "muted",
      text: s.ota.listening ? "listening for updates over MQTT" : "not subscribed to updates yet" }));
  }
  if (updates.length) {
    const rows = updates.sort().map(([model, u]) => {
      const bar = el("div", { class: "bar" }, el("div"));
      bar.firstChild.style.width = `${Math.max(0, Math.min(100, u.progress ?? (u.state === "active" ? 100 : 0)))}%`;
      return el("tr", { "data-model": model }, el("td", { text: model }),
        el("td", { text: u.version }), el("td", { class: stateClass(u.state), text: u.state }),
        el("td", {}, bar), el("td", { class: "muted", text: `${u.detail || ""} ${ago(u.ts)}` }));
    });
    parts.push(el("table", {}, el("thead", {}, el("tr", {}, ...["model", "version", "state",
      "progress", "detail"].map((t) => el("th", { text: t })))), el("tbody", {}, ...rows)));
  }
  for (const [model, p] of Object.entries(shadows)) {
    const done = p.min_samples ? Math.min(100, (100 * p.samples) / p.min_samples) : 0;
    const bar = el("div", { class: "bar" }, el("div"));
    bar.firstChild.style.width = `${done}%`;
    parts.push(el("div", { class: "shadow" },
      el("p", { text: `shadow ${model}: ${p.candidate} beside ${p.serving}, ${p.state}, ` +
                      `${p.samples}/${p.min_samples} samples${p.failing && p.failing.length
                        ? `, failing ${p.failing.join(", ")}` : ""}` }), bar));
  }
  if (!parts.length) parts.push(el("p", { class: "muted", text: "no updates" }));
  box.replaceChildren(...parts);
}

function drawTelemetry(s) {
  const items = [["pid", s.pid], ["uptime", duration(s.uptime_s)]];
  const rss = s.process && s.process.rss_bytes;
  items.push(["memory (RSS)", rss ? `${(rss / 2 ** 20).toFixed(0)} MiB` : "–"]);
  items.push(["MQTT", s.mqtt ? `${s.mqtt.connected ? "connected" : "NOT connected"}, ` +
    `published ${count(s.mqtt.published)}, buffered ${count(s.mqtt.buffered)}` : "off"]);
  for (const gpu of s.gpus || []) {
    items.push([`gpu ${gpu.index}`, `${gpu.name} · ${(gpu.memory_used_bytes / 2 ** 20).toFixed(0)}` +
      `/${(gpu.memory_total_bytes / 2 ** 20).toFixed(0)} MiB` +
      (gpu.utilization_percent === null ? "" : ` · ${gpu.utilization_percent}% busy`)]);
  }
  const j = s.jetson;
  if (j) {
    items.push(["Jetson", `L4T ${j.l4t || "?"} · power mode ${j.power_mode || j.power_mode_id || "?"}` +
      ` · ${j.throttled ? `THROTTLED ${(j.hot_zones || []).join(", ")}` : "not throttled"}`]);
    const temps = Object.entries(j.temperatures_c || {}).sort((a, b) => b[1] - a[1]).slice(0, 3);
    if (temps.length) items.push(["hottest", temps.map(([k, v]) => `${k} ${v.toFixed(1)} °C`).join(", ")]);
    const rails = Object.entries(j.rails || {});
    if (rails.length) items.push(["power", rails.map(([k, v]) => `${k} ${v.watts.toFixed(1)} W`).join(", ")]);
    const gpuClock = (j.clocks_hz || {}).gpu;
    if (gpuClock) items.push(["gpu clock", `${(gpuClock.now / 1e6).toFixed(0)} MHz`]);
  }
  document.getElementById("telemetry").replaceChildren(
    ...items.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: String(v ?? "–") })]));
}

function drawRecent(s) {
  const rows = (s.recent || []).slice(-8).reverse();
  const list = document.getElementById("recent");
  if (!rows.length) {
    list.replaceChildren(el("li", { class: "muted", text: "none" }));
    return;
  }
  list.replaceChildren(...rows.map((r) => el("li", {
    text: `${clock(r.ts)} ${String(r.level).toLowerCase()} ${r.message}` +
          (r.stream ? ` [stream ${r.stream}]` : "") + (r.model ? ` [model ${r.model}]` : ""),
  })));
}

// -- polling ------------------------------------------------------------------------------
async function refresh() {
  try {
    const status = await getJSON("/v2/edged/status");
    edged.status = status;
    drawHeader(status);
    drawStreams(status.streams || {});
    drawModels(status);
    drawUpdates(status);
    drawTelemetry(status);
    drawRecent(status);
    if (window.drawGallery) window.drawGallery(status); // gallery.js: faces on this daemon
  } catch (error) {
    const health = document.getElementById("health");
    health.textContent = "unreachable";
    health.className = "pill bad";
    health.title = String(error);
  }
  try {
    const events = await getJSON(`/v2/edged/events?limit=${EVENTS_SHOWN}`);
    drawEvents(events.events || []);
  } catch (error) {
    // A daemon without events answers 404: the section stays as it is.
  }
  setTimeout(refresh, POLL_MS);
}

refresh();
