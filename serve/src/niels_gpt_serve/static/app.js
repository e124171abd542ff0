// niels-serve page: stream a generation, then show its attention. Plain JS, no library.
// Every text from the server goes in through textContent, never as markup.
"use strict";

const $ = (id) => document.getElementById(id);
const ACCENT = "37, 99, 235";
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
    await layerAttention(layer);
  } catch (err) {
    setState("error", `attention: ${err.message}`);
    return;
  }
  renderHeatmap();
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
  const size = Math.max(6, Math.min(18, Math.floor(720 / t)));
  map.style.gridTemplateColumns = `3.5em repeat(${t}, ${size}px)`;
  map.style.gridAutoRows = `${size}px`;
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
    label.textContent = shown(q);
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
    spans[k].dataset.attn = String(row[k]);
    spans[k].style.backgroundColor = `rgba(${ACCENT}, ${(row[k] / top).toFixed(4)})`;
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
    delete span.dataset.attn;
  }
  for (const cell of $("heatmap").querySelectorAll(".row-hover")) cell.classList.remove("row-hover");
}

function options(select, count, name) {
  select.replaceChildren();
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
  $("model-info").textContent =
    `${model.arch} · ${model.params.toLocaleString("en")} params · step ${model.step} · ` +
    `T=${model.T} C=${model.C} L=${model.L} H=${model.H} · run ${model.run}`;
  $("max_new_tokens").max = String(model.max_new_tokens);
  options($("layer"), model.L, "layer");
  options($("head"), model.H, "head");
  $("layer").addEventListener("change", showAttention);
  $("head").addEventListener("change", renderHeatmap);
  $("controls").addEventListener("submit", generate);
  $("stop").addEventListener("click", () => state.abort && state.abort.abort());
  setState("idle", "ready");
}

init().catch((err) => setState("error", `could not load the model: ${err.message}`));
