// The zone and line helper: click points on a stream's latest frame, get the `zones:` and
// `lines:` YAML for that stream to paste into the config. Points are frame pixels (the
// picture is the stream's own size, `latest.jpg?raw=1`), as the config takes them. Nothing is
// sent to the daemon: the page stays read-only.
"use strict";

(() => {
  const NAME = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/;
  const BARE = /^[A-Za-z][A-Za-z0-9_.-]*$/;
  const YAML_WORDS = new Set(["yes", "no", "true", "false", "on", "off", "null"]);
  const ZONE_DEFAULTS = { anchor: "bottom_center", inertia: 2, min_overlap: 0.5 };
  const LINE_DEFAULTS = { anchor: "bottom_center" };
  const ZONE_COLOUR = "#00bfff";
  const LINE_COLOUR = "#dc143c";
  const DRAFT_COLOUR = "#ffd400";
  const REFRESH_MS = 1000;

  const $ = (id) => document.getElementById(id);
  const dialog = $("helper");
  const img = $("helper-img");
  const canvas = $("helper-canvas");
  const state = { stream: null, shapes: [], draft: [], timer: null };

  const mode = () => document.querySelector('input[name="helper-mode"]:checked').value;

  function extras(config, defaults) {
    const out = {};
    for (const [key, value] of Object.entries(defaults)) {
      if (config[key] !== undefined && config[key] !== value) out[key] = config[key];
    }
    return out;
  }

  function open(stream) {
    const row = ((window.edged && window.edged.status) || {}).streams?.[stream] || {};
    state.stream = stream;
    state.draft = [];
    state.shapes = [
      ...(row.zones || []).map((z) => ({ kind: "zone", name: z.name,
        points: z.polygon.map((p) => p.slice()), extra: extras(z, ZONE_DEFAULTS) })),
      ...(row.lines || []).map((l) => ({ kind: "line", name: l.name,
        points: l.points.map((p) => p.slice()), extra: extras(l, LINE_DEFAULTS) })),
    ];
    $("helper-stream").textContent = stream;
    $("helper-error").textContent = "";
    suggestName();
    refreshPicture();
    if (!dialog.open) dialog.showModal();
    render();
  }

  function close() {
    clearTimeout(state.timer);
    state.timer = null;
    img.removeAttribute("src");
  }

  function refreshPicture() {
    clearTimeout(state.timer);
    if (!state.stream) return;
    img.onload = () => {
      render();
      if (dialog.open) state.timer = setTimeout(refreshPicture, REFRESH_MS);
    };
    img.onerror = () => {
      $("helper-error").textContent = "no picture from this stream yet";
      if (dialog.open) state.timer = setTimeout(refreshPicture, REFRESH_MS);
    };
    img.src = `/v2/edged/streams/${encodeURIComponent(state.stream)}/latest.jpg?raw=1&t=${Date.now()}`;
  }

  function suggestName() {
    const kind = mode();
    const taken = new Set(state.shapes.map((s) => s.name));
    let n = 1;
    while (taken.has(`${kind}${n}`)) n += 1;
    $("helper-name").value = `${kind}${n}`;
    $("helper-finish").textContent = kind === "zone" ? "finish zone" : "finish line";
  }

  // -- points ---------------------------------------------------------------------------
  function framePoint(event) {
    const rect = canvas.getBoundingClientRect();
    const width = img.naturalWidth;
    const height = img.naturalHeight;
    const x = Math.round(((event.clientX - rect.left) / rect.width) * width);
    const y = Math.round(((event.clientY - rect.top) / rect.height) * height);
    return [Math.min(Math.max(x, 0), width), Math.min(Math.max(y, 0), height)];
  }

  canvas.addEventListener("click", (event) => {
    if (!img.naturalWidth) return;
    state.draft.push(framePoint(event));
    $("helper-error").textContent = "";
    if (mode() === "line" && state.draft.length === 2) finish();
    render();
  });

  function cross(a, b, c) {
    return (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0]);
  }

  function segmentsCross(p1, p2, q1, q2) {
    const d1 = cross(q1, q2, p1);
    const d2 = cross(q1, q2, p2);
    const d3 = cross(p1, p2, q1);
    const d4 = cross(p1, p2, q2);
    return ((d1 > 0 && d2 < 0) || (d1 < 0 && d2 > 0)) && ((d3 > 0 && d4 < 0) || (d3 < 0 && d4 > 0));
  }

  function problem(kind, name, points) {
    if (!NAME.test(name)) return `"${name}" is not a valid name: letters, digits, _ . - (up to 64)`;
    if (state.shapes.some((s) => s.kind === kind && s.name === name)) return `there is a ${kind} ${name} already`;
    const same = (a, b) => a[0] === b[0] && a[1] === b[1];
    if (kind === "line") {
      if (points.length !== 2) return "a line takes two points";
      return same(points[0], points[1]) ? "the line has zero length" : null;
    }
    if (points.length < 3) return "a zone takes three points or more";
    for (let i = 0; i < points.length; i += 1) {
      if (same(points[i], points[(i + 1) % points.length])) return `points ${i} and ${(i + 1) % points.length} are the same`;
    }
    const n = points.length;
    for (let i = 0; i < n; i += 1) {
      for (let j = i + 2; j < n; j += 1) {
        if (i === 0 && j === n - 1) continue; // neighbours through the closing edge
        if (segmentsCross(points[i], points[(i + 1) % n], points[j], points[(j + 1) % n])) {
          return `edges ${i} and ${j} cross: the zone intersects itself`;
        }
      }
    }
    return null;
  }

  function finish() {
    const kind = mode();
    const name = $("helper-name").value.trim();
    const why = problem(kind, name, state.draft);
    if (why) {
      $("helper-error").textContent = why;
      if (kind === "line") state.draft = [];
      render();
      return;
    }
    state.shapes.push({ kind, name, points: state.draft, extra: {} });
    state.draft = [];
    suggestName();
    render();
  }

  // -- YAML -----------------------------------------------------------------------------
  function scalar(value) {
    if (typeof value === "number") return String(value);
    const text = String(value);
    return BARE.test(text) && !YAML_WORDS.has(text.toLowerCase()) ? text : JSON.stringify(text);
  }

  function item(shape) {
    const key = shape.kind === "zone" ? "polygon" : "points";
    const points = shape.points.map(([x, y]) => `[${x}, ${y}]`).join(", ");
    const extra = Object.entries(shape.extra || {}).map(([k, v]) => `, ${k}: ${scalar(v)}`).join("");
    return `  - {name: ${scalar(shape.name)}, ${key}: [${points}]${extra}}`;
  }

  function yaml() {
    const zones = state.shapes.filter((s) => s.kind === "zone");
    const lines = state.shapes.filter((s) => s.kind === "line");
    const out = [`# stream ${state.stream}: its zones and lines, in frame pixels`];
    out.push(zones.length ? "zones:" : "zones: []", ...zones.map(item));
    out.push(lines.length ? "lines:" : "lines: []", ...lines.map(item));
    return `${out.join("\n")}\n`;
  }

  // -- drawing --------------------------------------------------------------------------
  function render() {
    const rect = canvas.getBoundingClientRect();
    const ratio = window.devicePixelRatio || 1;
    canvas.width = Math.max(1, Math.round(rect.width * ratio));
    canvas.height = Math.max(1, Math.round(rect.height * ratio));
    const ctx = canvas.getContext("2d");
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    if (img.naturalWidth) {
      const sx = canvas.width / img.naturalWidth;
      const sy = canvas.height / img.naturalHeight;
      const at = ([x, y]) => [x * sx, y * sy];
      ctx.lineWidth = 2 * ratio;
      ctx.font = `${12 * ratio}px system-ui, sans-serif`;
      for (const shape of state.shapes) drawShape(ctx, shape, at, ratio);
      drawDraft(ctx, at, ratio);
    }
    drawList();
    $("helper-yaml").value = yaml();
  }

  function drawShape(ctx, shape, at, ratio) {
    const points = shape.points.map(at);
    if (shape.kind === "zone") {
      ctx.strokeStyle = ZONE_COLOUR;
      ctx.fillStyle = "rgba(0, 191, 255, 0.18)";
      ctx.beginPath();
      points.forEach(([x, y], i) => (i ? ctx.lineTo(x, y) : ctx.moveTo(x, y)));
      ctx.closePath();
      ctx.fill();
      ctx.stroke();
      ctx.fillStyle = ZONE_COLOUR;
      ctx.fillText(`zone ${shape.name}`, points[0][0] + 4 * ratio, points[0][1] + 14 * ratio);
      return;
    }
    const [[x1, y1], [x2, y2]] = points;
    ctx.strokeStyle = ctx.fillStyle = LINE_COLOUR;
    ctx.beginPath();
    ctx.moveTo(x1, y1);
    ctx.lineTo(x2, y2);
    // The arrow points to the side "in" crossings go to: the right of p1→p2 on the screen.
    const length = Math.hypot(x2 - x1, y2 - y1) || 1;
    const reach = Math.min(24 * ratio, length / 2);
    const mx = (x1 + x2) / 2;
    const my = (y1 + y2) / 2;
    const tx = mx - ((y2 - y1) / length) * reach;
    const ty = my + ((x2 - x1) / length) * reach;
    ctx.moveTo(mx, my);
    ctx.lineTo(tx, ty);
    ctx.stroke();
    ctx.beginPath();
    ctx.arc(tx, ty, 3 * ratio, 0, 2 * Math.PI);
    ctx.fill();
    ctx.fillText(`line ${shape.name} (in)`, tx + 4 * ratio, ty);
  }

  function drawDraft(ctx, at, ratio) {
    if (!state.draft.length) return;
    const points = state.draft.map(at);
    ctx.strokeStyle = ctx.fillStyle = DRAFT_COLOUR;
    ctx.beginPath();
    points.forEach(([x, y], i) => (i ? ctx.lineTo(x, y) : ctx.moveTo(x, y)));
    ctx.stroke();
    for (const [x, y] of points) {
      ctx.beginPath();
      ctx.arc(x, y, 3 * ratio, 0, 2 * Math.PI);
      ctx.fill();
    }
  }

  function drawList() {
    const list = $("helper-shapes");
    list.replaceChildren(...state.shapes.map((shape, i) => {
      const remove = document.createElement("button");
      remove.type = "button";
      remove.textContent = "remove";
      remove.addEventListener("click", () => {
        state.shapes.splice(i, 1);
        render();
      });
      const label = document.createElement("span");
      label.textContent = `${shape.kind} ${shape.name}: ${shape.points.length} points`;
      const row = document.createElement("li");
      row.append(label, remove);
      return row;
    }));
  }

  // -- controls -------------------------------------------------------------------------
  for (const radio of document.querySelectorAll('input[name="helper-mode"]')) {
    radio.addEventListener("change", () => {
      state.draft = [];
      suggestName();
      render();
    });
  }
  $("helper-finish").addEventListener("click", finish);
  $("helper-undo").addEventListener("click", () => {
    state.draft.pop();
    render();
  });
  $("helper-clear").addEventListener("click", () => {
    state.shapes = [];
    state.draft = [];
    suggestName();
    render();
  });
  $("helper-copy").addEventListener("click", async () => {
    const text = $("helper-yaml");
    try {
      await navigator.clipboard.writeText(text.value);
      $("helper-copy").textContent = "copied";
    } catch (error) {
      text.select(); // no clipboard here: selected for Ctrl+C
    }
    setTimeout(() => { $("helper-copy").textContent = "copy YAML"; }, 1500);
  });
  dialog.addEventListener("close", close);
  window.addEventListener("resize", () => dialog.open && render());

  window.edgedHelper = { open, yaml, finish };
})();
