// niels-serve page: stream a generation, then show its attention. Plain JS, no library.
// Every text from the server goes in through textContent, never as markup.
"use strict";

const $ = (id) => document.getElementById(id);
const ACCENT = "37, 99, 235";
// A hovered token's shade: at most this alpha of the accent, so the page's ink on it keeps a
// contrast of 6:1 or more (grey prompt text on a full shade had 1.2:1 and could not be read).
const TOKEN_SHADE_MAX = 0.6;
const INK = "#1f2328"; // --ink
const MAX_CELL_PX = 18;
const KNOBS = ["max_new_tokens", "temperature", "top_k", "top_p", "seed", "eos"];

const state = {
  model: null,
  tokens: [], // prompt + generated token ids
  labels: [], // how each is shown
  promptLength: 0,
  attention: new Map(), // layer -> [head][query][key]
  abort: null,
};

function setState(name, text) {
  document.body.dataset.state = name;
  $("status").textContent = text;
}

// A space on an axis or in a caption would read as nothing: show it as an open box.
function shown(i) {
  return state.labels[i] === " " ? "\u2423" : state.labels[i];
}

function isEscape(label) {
  return label.length > 1 && label.startsWith("\\");
}

function tokenSpan(i) {
  const span = document.createElement("span");
  const label = state.labels[i];
  span.className = "tok " + (i < state.promptLength ? "prompt" : "gen");
  if (isEscape(label)) span.classList.add("escape");
  span.dataset.i = String(i);
  span.dataset.token = String(state.tokens[i]);
  span.textContent = label;
  span.title = `#${i}: byte ${state.tokens[i]}`;
  span.addEventListener("mouseenter", () => showWhereAttends(i));
  span.addEventListener("mouseleave", clearHover);
  return span;
}

function addToken(id, label) {
  state.tokens.push(id);
  state.labels.push(label);
  $("tokens").appendChild(tokenSpan(state.tokens.length - 1));
}

function readKnobs() {
  const body = { prompt: $("prompt").value };
  for (const name of KNOBS) {
    const raw = $(name).value.trim();
    if (raw === "") {
      if (name === "max_new_tokens") body[name] = 0;
      else body[name] = null;
      continue;
    }
    if (name === "seed") {
      body[name] = raw; // an exact decimal string: a JS number rounds seeds past 2**53
      continue;
    }
    const value = Number(raw);
    body[name] = Number.isFinite(value) ? value : raw; // the server names a bad one
  }
  if (body.temperature === null) delete body.temperature;
  return body;
}

function markInvalid(field) {
  for (const el of document.querySelectorAll(".invalid")) el.classList.remove("invalid");
  const el = $(field);
  if (el) el.classList.add("invalid");
}

async function generate(event) {
  event.preventDefault();
  if (state.abort) return;
  markInvalid(null);
  state.tokens = [];
  state.labels = [];
  state.promptLength = 0;
  state.attention.clear();
  $("tokens").replaceChildren();
  $("heatmap").replaceChildren();
  $("heads").replaceChildren();
  const controller = new AbortController();
  state.abort = controller;
  $("generate").disabled = true;
  $("stop").disabled = false;
  setState("streaming", "waiting for the first token…");
  try {
    const response = await fetch("/api/generate/stream", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(readKnobs()),
      signal: controller.signal,
    });
    if (!response.ok) {
      const err = await response.json();
      markInvalid(err.field);
      setState("error", `error ${response.status}: ${err.detail}`);
      return;
    }
    await readEvents(response.body.getReader());
  } catch (err) {
    if (err.name === "AbortError") setState("stopped", `stopped after ${generated()} tokens`);
    else setState("error", `error: ${err.message}`);
  } finally {
    state.abort = null;
    $("generate").disabled = false;
    $("stop").disabled = true;
  }
}

function generated() {
  return state.tokens.length - state.promptLength;
}

async function readEvents(reader) {
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let name = "message";
      let data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) name = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
      }
      await onEvent(name, JSON.parse(data));
    }
  }
}

async function onEvent(name, data) {
  if (name === "start") {
    state.promptLength = data.prompt_tokens.length;
    data.prompt_tokens.forEach((id, i) => addToken(id, data.labels[i]));
    $("seed").placeholder = `random (last: ${data.seed_text})`;
  } else if (name === "token") {
    addToken(data.token, data.label);
    setState("streaming", `streaming: ${generated()} tokens`);
  } else if (name === "done") {
    const ms = Math.round(data.total_ms);
    setState("done", `done: ${data.tokens.length} tokens (${data.finish_reason}), seed ${data.seed_text}, ${ms} ms`);
    await showAttention();
  } else if (name === "error") {
    setState("error", `error: ${data.detail}`);
  }
}

// Every layer's attention at once (one request): the overview shows all of them.
async function allAttention() {
  const response = await fetch("/api/attention", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ tokens: state.tokens, layer: null }),
  });
  const body = await response.json();
  if (!response.ok) throw new Error(body.detail);
  body.layers.forEach((layer, i) => state.attention.set(layer, body.attention[i])); // [head][q][k]
}

async function layerAttention(layer) {
  if (!state.attention.has(layer)) {
    const response = await fetch("/api/attention", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ tokens: state.tokens, layer }),
    });
    const body = await response.json();
    if (!response.ok) throw new Error(body.detail);
    state.attention.set(layer, body.attention[0]); // [head][query][key]
  }
  return state.attention.get(layer);
}

function currentMatrix() {
  const heads = state.attention.get(Number($("layer").value));
  return heads ? heads[Number($("head").value)] : null;
}

async function showAttention() {
  if (state.tokens.length === 0) return;
  const layer = Number($("layer").value);
  try {
    if (state.attention.size === 0) await allAttention();
    await layerAttention(layer);
  } catch (err) {
    setState("error", `attention: ${err.message}`);
    return;
  }
  renderHeatmap();
  renderHeads();
}

function rowMax(row) {
  let best = 0;
  for (const v of row) best = Math.max(best, v);
  return best > 0 ? best : 1;
}

function renderHeatmap() {
  const matrix = currentMatrix();
  const map = $("heatmap");
  map.replaceChildren();
  if (!matrix) return;
  const t = matrix.length;
  // Fit the box's width (a phone's too): cells shrink to 1 px, gaps go below 6 px.
  const labelPx = 36;
  const room = Math.max(0, $("heatmap-box").clientWidth - labelPx - 8);
  const fit = Math.floor(room / t);
  const gap = fit >= 7 ? 1 : 0;
  const size = Math.max(1, Math.min(MAX_CELL_PX, fit - gap));
  map.style.gap = `${gap}px`;
  map.style.gridTemplateColumns = `${labelPx}px repeat(${t}, ${size}px)`;
  map.style.gridAutoRows = `${size}px`;
  map.dataset.cell = String(size);
  map.dataset.layer = $("layer").value;
  map.dataset.head = $("head").value;
  map.dataset.t = String(t);
  map.appendChild(document.createElement("div"));
  for (let k = 0; k < t; k++) {
    const label = document.createElement("div");
    label.className = "label col";
    label.textContent = size >= 10 ? shown(k) : "";
    map.appendChild(label);
  }
  for (let q = 0; q < t; q++) {
    const label = document.createElement("div");
    label.className = "label";
    label.textContent = size >= 8 ? shown(q) : "";
    map.appendChild(label);
    const top = rowMax(matrix[q]);
    for (let k = 0; k < t; k++) {
      const cell = document.createElement("div");
      cell.className = "cell";
      cell.dataset.q = String(q);
      cell.dataset.k = String(k);
      if (k > q) {
        cell.classList.add("future"); // causal: a query never sees a later key
      } else {
        const v = matrix[q][k];
        cell.dataset.v = String(v);
        cell.style.backgroundColor = `rgba(${ACCENT}, ${(v / top).toFixed(4)})`;
        cell.title = `query #${q} ${shown(q)} -> key #${k} ${shown(k)}: ${v}`;
        cell.addEventListener("mouseenter", () => showWhereAttends(q));
      }
      map.appendChild(cell);
    }
  }
  showOverview(matrix);
}

// One line on what the chosen head does, averaged over every row but the first (which can
// only attend to itself): the share of attention on the token before, on itself, on the
// first token, and how far back it looks on average.
function headFigures(matrix) {
  const t = matrix.length;
  let prev = 0, self = 0, first = 0, distance = 0;
  for (let q = 1; q < t; q++) {
    prev += matrix[q][q - 1];
    self += matrix[q][q];
    first += matrix[q][0];
    for (let k = 0; k <= q; k++) distance += matrix[q][k] * (q - k);
  }
  const rows = t - 1;
  return { prev: prev / rows, self: self / rows, first: first / rows, distance: distance / rows };
}

const pct = (v) => `${Math.round(100 * v)}%`;

function showOverview(matrix) {
  const t = matrix.length;
  const box = $("overview");
  if (t < 2) {
    box.textContent = "";
    return;
  }
  const figures = headFigures(matrix);
  for (const [name, value] of Object.entries(figures)) box.dataset[name] = String(value);
  box.textContent =
    `Layer ${$("layer").value}, head ${$("head").value}, averaged over rows 1 to ${t - 1}: ` +
    `${pct(figures.prev)} of a token's attention goes to the token just before it, ` +
    `${pct(figures.self)} to itself, ${pct(figures.first)} to the first token; ` +
    `it looks back ${figures.distance.toFixed(1)} tokens on average.`;
}

function showWhereAttends(q) {
  clearHover();
  const matrix = currentMatrix();
  const spans = $("tokens").children;
  if (!matrix || q >= matrix.length) return;
  const row = matrix[q];
  const top = rowMax(row);
  spans[q].classList.add("query");
  for (let k = 0; k <= q; k++) {
    const alpha = (TOKEN_SHADE_MAX * row[k]) / top;
    spans[k].dataset.attn = String(row[k]);
    spans[k].style.backgroundColor = `rgba(${ACCENT}, ${alpha.toFixed(4)})`;
    spans[k].style.color = INK; // the prompt's grey on a shade is unreadable
  }
  for (const cell of $("heatmap").querySelectorAll(`.cell[data-q="${q}"]`)) {
    cell.classList.add("row-hover");
  }
  const best = row
    .map((v, k) => [v, k])
    .slice(0, q + 1)
    .sort((a, b) => b[0] - a[0])
    .slice(0, 3)
    .map(([v, k]) => `#${k} ${shown(k)} ${v.toFixed(3)}`);
  $("hover-info").textContent = `#${q} ${shown(q)} attends most to: ${best.join(", ")}`;
}

function clearHover() {
  for (const span of $("tokens").children) {
    span.classList.remove("query");
    span.style.backgroundColor = "";
    span.style.color = "";
    delete span.dataset.attn;
  }
  for (const cell of $("heatmap").querySelectorAll(".row-hover")) cell.classList.remove("row-hover");
}

function options(select, count, name) {
  select.replaceChildren();
  select.disabled = false;
  for (let i = 0; i < count; i++) {
    const option = document.createElement("option");
    option.value = String(i);
    option.textContent = `${name} ${i}`;
    select.appendChild(option);
  }
}

async function init() {
  const response = await fetch("/api/model");
  const model = await response.json();
  state.model = model;
  const trained = model.training;
  const loss = trained.val_loss === null ? "no val loss" : `val loss ${trained.val_loss.toFixed(3)}`;
  $("model-info").textContent =
    `${model.arch} · ${model.params.toLocaleString("en")} params · step ${model.step} · ` +
    `${loss} · T=${model.T} C=${model.C} L=${model.L} H=${model.H} · run ${model.run}`;
  $("training").textContent = trained.summary;
  $("training").classList.toggle("barely", trained.barely_trained);
  $("max_new_tokens").max = String(model.max_new_tokens);
  options($("layer"), model.L, "layer");
  options($("head"), model.H, "head");
  $("layer").addEventListener("change", showAttention);
  $("head").addEventListener("change", () => {
    renderHeatmap();
    renderHeads();
  });
  $("controls").addEventListener("submit", generate);
  $("stop").addEventListener("click", () => state.abort && state.abort.abort());
  let resizing = false;
  window.addEventListener("resize", () => {
    if (resizing) return;
    resizing = true;
    requestAnimationFrame(() => {
      resizing = false;
      renderHeatmap();
    });
  });
  setState("idle", "ready");
  // Ready: what a screenshot or a test waits on (body[data-ready="true"]); until then the
  // selects say "loading…" and Generate is disabled, so nothing empty or dead shows.
  $("generate").disabled = false;
  document.body.removeAttribute("aria-busy");
  document.body.dataset.ready = "true";
}

init().catch((err) => {
  document.body.removeAttribute("aria-busy");
  setState("error", `could not load the model: ${err.message}`);
});
