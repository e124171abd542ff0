// niels-serve page, the overview: every head of every layer as a small heatmap, so a user
// can find an interesting head. Loaded before app.js, whose state, $, ACCENT, rowMax,
// headFigures, pct and showAttention it calls (only once the page is running).
"use strict";

// The overview: every head of every layer as a small heatmap (a row per layer), shaded as the
// big one (each row relative to its largest), one canvas pixel a cell. Clicking one picks it.
const THUMB_PX = 64;
const FUTURE_RGB = [243, 244, 246]; // .heatmap .cell.future

function drawHead(canvas, matrix) {
  const t = matrix.length;
  canvas.width = t;
  canvas.height = t;
  const ctx = canvas.getContext("2d");
  const image = ctx.createImageData(t, t);
  const rgb = ACCENT.split(",").map(Number);
  for (let q = 0; q < t; q++) {
    const top = rowMax(matrix[q]);
    for (let k = 0; k < t; k++) {
      const at = 4 * (q * t + k);
      const future = k > q;
      const [r, g, b] = future ? FUTURE_RGB : rgb;
      image.data[at] = r;
      image.data[at + 1] = g;
      image.data[at + 2] = b;
      image.data[at + 3] = future ? 255 : Math.round((255 * matrix[q][k]) / top);
    }
  }
  ctx.putImageData(image, 0, 0);
}

function renderHeads() {
  const box = $("heads");
  box.replaceChildren();
  if (state.attention.size === 0) return;
  const chosen = [$("layer").value, $("head").value];
  for (const [layer, heads] of [...state.attention.entries()].sort((a, b) => a[0] - b[0])) {
    const row = document.createElement("div");
    row.className = "heads-row";
    const name = document.createElement("span");
    name.className = "heads-layer";
    name.textContent = `layer ${layer}`;
    row.appendChild(name);
    heads.forEach((matrix, head) => {
      const button = document.createElement("button");
      button.type = "button";
      button.className = "head";
      button.dataset.layer = String(layer);
      button.dataset.head = String(head);
      const canvas = document.createElement("canvas");
      canvas.style.width = `${THUMB_PX}px`;
      canvas.style.height = `${THUMB_PX}px`;
      drawHead(canvas, matrix);
      const caption = document.createElement("span");
      caption.textContent = `head ${head}`;
      button.append(canvas, caption);
      if (matrix.length > 1) {
        const f = headFigures(matrix);
        button.title =
          `layer ${layer}, head ${head}: ${pct(f.prev)} to the token before, ${pct(f.self)} ` +
          `to itself, ${pct(f.first)} to the first; looks back ${f.distance.toFixed(1)} on average`;
      }
      const picked = String(layer) === chosen[0] && String(head) === chosen[1];
      button.classList.toggle("chosen", picked);
      button.setAttribute("aria-pressed", String(picked));
      button.addEventListener("click", () => pickHead(layer, head));
      row.appendChild(button);
    });
    box.appendChild(row);
  }
}

async function pickHead(layer, head) {
  $("layer").value = String(layer);
  $("head").value = String(head);
  await showAttention();
}
