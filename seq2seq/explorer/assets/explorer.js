// The attention explorer: reads the JSON embedded in the page (<script id="data">) and draws SVG.
// No library, no request to any host: the page works from file://, offline and inside W&B.
"use strict";

// The SVG namespace: a name, not a resource. Spelled in parts so that the page holds no URL at
// all (the test that no resource is fetched looks for any).
const SVG = ["http:", "", "www.w3.org", "2000", "svg"].join("/");
const DATA = JSON.parse(document.getElementById("data").textContent);
const snapshots = [...DATA.checkpoints, DATA]; // oldest first: the checkpoint slider's stops
const state = { snapshot: snapshots.length - 1, sentence: 0, map: "forced", layer: "avg",
                head: "avg", gold: true, shown: DATA.models.slice(0, 4).map((m) => m.name) };

function el(tag, attributes = {}, text) {
  const node = tag.startsWith("svg:")
    ? document.createElementNS(SVG, tag.slice(4))
    : document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

function data() { return snapshots[state.snapshot]; }
function sentence() { return data().sentences[state.sentence]; }

// The map a panel draws: decoding attention, the teacher-forced average, or one layer/head.
function chosenMap(view, model) {
  if (state.map === "decoding") {
    return view.hyp_attention && { ...view.hyp_attention, rows: view.hyp_tokens, cols: view.src_tokens };
  }
  if (state.map === "encoder" || state.map === "decoder") {
    const maps = state.map === "encoder" ? view.encoder_self : view.decoder_self;
    if (!maps) return null; // an RNN model has no self-attention
    const layer = maps[state.layer === "avg" ? maps.length - 1 : Number(state.layer)];
    const map = layer && (state.head === "avg" ? averageHeads(layer) : layer[Number(state.head)]);
    if (!map) return null; // models differ in layers and heads: this one has no such

    const rows = state.map === "encoder" ? view.src_tokens : view.tgt_tokens;
    const cols = state.map === "encoder" ? view.src_tokens : view.decoder_inputs;
    return { ...map, rows, cols };
  }
  let map = view.forced;
  if (view.heads && state.layer !== "avg") {
    const layer = view.heads[Number(state.layer)];
    map = layer && (state.head === "avg" ? averageHeads(layer) : layer[Number(state.head)]);
    if (!map) return null;
  }
  return { ...map, rows: view.tgt_tokens, cols: view.src_tokens };
}

function averageHeads(layer) {
  const weights = layer[0].weights.map((row, t) =>
    row.map((_, s) => layer.reduce((sum, head) => sum + head.weights[t][s], 0) / layer.length));
  return { weights, entropy: weights.map(entropyOf), aer: null, spread: null };
}

function entropyOf(row) {
  return row.reduce((sum, w) => (w > 0 ? sum - w * Math.log(w) : sum), 0);
}

// Cell size: long sentences shrink the cells; below 10 px the tokens go to tooltips.
function cellSize(rows, cols) {
  return Math.max(4, Math.min(28, Math.floor(640 / Math.max(rows, cols, 1))));
}

function heatmap(map, gold, name, difference = false) {
  const rows = map.rows.length, cols = map.cols.length, cell = cellSize(rows, cols);
  const labels = cell >= 10;
  const left = labels ? 90 : 4, top = labels ? 70 : 4, entropyWidth = 40;
  const svg = el("svg:svg", { width: left + cols * cell + entropyWidth + 8, height: top + rows * cell + 4,
                              "data-model": name, class: "map" });
  const maxEntropy = Math.log(Math.max(cols, 2));
  const zeros = map.zeros ? map.zeros.map((columns) => new Set(columns)) : null;
  map.weights.forEach((row, t) => {
    row.forEach((w, s) => {
      const color = difference
        ? (w >= 0 ? `rgba(178,24,43,${Math.min(1, w)})` : `rgba(33,102,172,${Math.min(1, -w)})`)
        : `rgba(8,48,107,${w})`;
      const rect = el("svg:rect", { x: left + s * cell, y: top + t * cell, width: cell, height: cell,
                                    fill: color, class: "cell", "data-row": t, "data-col": s, "data-w": w });
      // Exactly 0 (a sparse normalizer's or a window's), not merely small after rounding.
      const exact = zeros && zeros[t] && zeros[t].has(s);
      if (exact) { // hatched (the page's pattern), so that no weight looks like none
        rect.setAttribute("data-zero", "");
        rect.setAttribute("fill", "url(#exact-zero)");
      }
      rect.appendChild(el("svg:title", {}, `${map.rows[t]} ← ${map.cols[s]}: ${exact ? "exactly 0" : w.toFixed(4)}`));
      rect.addEventListener("mouseenter", () => highlight(t, s));
      svg.appendChild(rect);
    });
    if (map.entropy) { // the entropy of the row, as a bar beside it (full width: uniform)
      const width = (entropyWidth * map.entropy[t]) / maxEntropy;
      const bar = el("svg:rect", { x: left + cols * cell + 4, y: top + t * cell + 1, width,
                                   height: Math.max(1, cell - 2), fill: "#999" });
      bar.appendChild(el("svg:title", {}, `entropy ${map.entropy[t].toFixed(3)} nats (uniform: ${maxEntropy.toFixed(3)})`));
      svg.appendChild(bar);
    }
  });
  if (labels) {
    map.rows.forEach((token, t) => {
      const text = el("svg:text", { x: left - 4, y: top + t * cell + cell * 0.7, "text-anchor": "end",
                                    class: "token row", "data-row": t }, token);
      text.addEventListener("mouseenter", () => highlight(t, null));
      svg.appendChild(text);
    });
    map.cols.forEach((token, s) => {
      const x = left + s * cell + cell * 0.7, y = top - 4;
      const text = el("svg:text", { x, y, transform: `rotate(-60 ${x} ${y})`, class: "token col",
                                    "data-col": s }, token);
      text.addEventListener("mouseenter", () => highlight(null, s));
      svg.appendChild(text);
    });
  }
  if (gold && state.gold && !difference) {
    for (const [kind, links] of [["sure", gold.sure], ["possible", gold.possible]]) {
      for (const [s, t] of links) { // Pharaoh links are source-target
        if (t < rows && s < cols) {
          svg.appendChild(el("svg:rect", { x: left + s * cell, y: top + t * cell, width: cell,
                                           height: cell, class: kind }));
        }
      }
    }
  }
  svg.appendChild(el("svg:rect", { class: "band", width: 0, height: 0, "data-band": "row" }));
  svg.appendChild(el("svg:rect", { class: "band", width: 0, height: 0, "data-band": "col" }));
  svg.dataset.geometry = JSON.stringify({ left, top, cell, rows, cols });
  return svg;
}

// Hovering a target token (row), a source token (column) or a cell: the same row and column
// light up in every panel, and the tokens read or read by it are drawn in bold.
function highlight(row, col) {
  for (const svg of document.querySelectorAll("svg.map")) {
    const { left, top, cell, rows, cols } = JSON.parse(svg.dataset.geometry);
    const band = (kind, show, attributes) => {
      const rect = svg.querySelector(`rect[data-band="${kind}"]`);
      const values = show ? attributes : { width: 0, height: 0 };
      for (const [key, value] of Object.entries(values)) rect.setAttribute(key, value);
    };
    band("row", row !== null && row < rows, { x: left, y: top + row * cell, width: cols * cell, height: cell });
    band("col", col !== null && col < cols, { x: left + col * cell, y: top, width: cell, height: rows * cell });
    // The hovered token in bold; the tokens on the other side shaded by their weight in its row
    // (the source tokens a target token reads) or column (the target tokens that read a source
    // token), the heaviest at full strength.
    const weight = (t, s) => Number(svg.querySelector(`rect.cell[data-row="${t}"][data-col="${s}"]`)?.dataset.w || 0);
    const others = row !== null && row < rows ? [...Array(cols).keys()].map((s) => weight(row, s))
                 : col !== null && col < cols ? [...Array(rows).keys()].map((t) => weight(t, col)) : null;
    const top_ = others ? Math.max(...others.map(Math.abs), 1e-9) : 1;
    for (const text of svg.querySelectorAll("text.token")) {
      const isRow = text.dataset.row !== undefined;
      const index = Number(isRow ? text.dataset.row : text.dataset.col);
      const lit = isRow ? index === row : index === col;
      text.classList.toggle("lit", lit);
      const shaded = others && (isRow ? col !== null && row === null : row !== null);
      text.style.fill = shaded ? `rgba(176,0,0,${0.15 + 0.85 * Math.abs(others[index]) / top_})` : "";
      text.classList.toggle("read", Boolean(shaded && Math.abs(others[index]) === top_));
    }
  }
  document.body.dataset.row = row === null ? "" : row;
  document.body.dataset.col = col === null ? "" : col;
}

function panel(model, view, gold) {
  const box = el("div", { class: "panel", "data-model": model.name });
  box.appendChild(el("h2", {}, model.name));
  const parts = [
    model.normalizer && model.normalizer !== "softmax"
      ? (model.normalizer === "entmax" ? `entmax α = ${model.alpha === null || model.alpha === undefined ? 1.5 : model.alpha}` : model.normalizer) : null,
    model.window && model.window !== "global"
      ? `${model.window} window, D = ${model.window_size === null || model.window_size === undefined ? 10 : model.window_size}` : null,
    model.key_bias ? "key bias" : null,
  ];
  const kind = [model.architecture, model.scoring, ...parts,
                model.layers ? `${model.layers} layers × ${model.heads} heads` : null]
    .filter(Boolean).join(" · ");
  box.appendChild(el("div", { class: "meta" }, kind));
  box.appendChild(el("div", { class: "hyp" }, `→ ${view.hypothesis}`));
  if (view.n_best.length > 1) {
    const list = el("ol", { class: "nbest" });
    for (const entry of view.n_best) list.appendChild(el("li", {}, `${entry.text} (${entry.score.toFixed(3)})`));
    box.appendChild(list);
  }
  const map = chosenMap(view, model);
  if (!map || map.rows.length === 0 || map.cols.length === 0) {
    box.appendChild(el("div", { class: "meta" },
                       map ? "no attention for an empty sentence" : "no such map in this model"));
    return box;
  }
  const on = { decoding: "its own translation, decoding", encoder: "encoder self-attention",
               decoder: `decoder self-attention, teacher-forced on the ${view.forced_on}` }[state.map]
    || `teacher-forced on the ${view.forced_on}`;
  const aer = map.aer === null || map.aer === undefined ? "" : ` · AER ${map.aer.toFixed(3)}`;
  box.appendChild(el("div", { class: "meta aer" }, `${on}${aer}`));
  box.appendChild(heatmap(map, state.map === "forced" ? gold : null, model.name));
  if (map.spread) box.appendChild(spreadChart(map.spread));
  if (view.heads && state.map === "forced") box.appendChild(thumbnails(view));
  return box;
}

// What the softmax saw: each score minus its row's mean (recovered exactly from the weights), as
// a histogram. Unscaled dot products spread wide (saturation); tanh keeps additive scores near.
function spreadChart(spread) {
  const width = 6, height = 40, top = Math.max(1, ...spread.counts);
  const svg = el("svg:svg", { width: spread.counts.length * width + 150, height: height + 14,
                              class: "spread" });
  spread.counts.forEach((count, i) => {
    const bar = (height * count) / top;
    const rect = el("svg:rect", { x: i * width, y: height - bar, width: width - 1, height: bar, fill: "#777" });
    rect.appendChild(el("svg:title", {}, `score − row mean in [${spread.low + i}, ${spread.low + i + 1}): ${count}`));
    svg.appendChild(rect);
  });
  svg.appendChild(el("svg:text", { x: 0, y: height + 12 }, `${spread.low}`));
  svg.appendChild(el("svg:text", { x: spread.counts.length * width - 12, y: height + 12 }, `${-spread.low}`));
  svg.appendChild(el("svg:text", { x: spread.counts.length * width + 6, y: 14 },
                     `score − row mean, std ${spread.std.toFixed(2)}`));
  return svg;
}

// Every layer's and head's map, small, with its AER and entropy: click one to show it.
function thumbnails(view) {
  const grid = el("div", { class: "thumbs" });
  grid.style.gridTemplateColumns = `repeat(${view.heads[0].length}, auto)`;
  view.heads.forEach((layer, l) => layer.forEach((head, h) => {
    const figure = el("figure", { "data-layer": l, "data-head": h });
    if (String(l) === state.layer && String(h) === state.head) figure.classList.add("chosen");
    const size = 3, rows = head.weights.length, cols = head.weights[0].length;
    const svg = el("svg:svg", { width: cols * size, height: rows * size });
    head.weights.forEach((row, t) => row.forEach((w, s) => svg.appendChild(
      el("svg:rect", { x: s * size, y: t * size, width: size, height: size, fill: `rgba(8,48,107,${w})` }))));
    figure.appendChild(svg);
    const meanEntropy = head.entropy.reduce((a, b) => a + b, 0) / Math.max(1, head.entropy.length);
    const aer = head.aer === null ? "" : ` AER ${head.aer.toFixed(2)}`;
    figure.appendChild(el("figcaption", {}, `L${l + 1}H${h + 1}${aer} H=${meanEntropy.toFixed(2)}`));
    figure.addEventListener("click", () => { state.layer = String(l); state.head = String(h); render(); });
    grid.appendChild(figure);
  }));
  return grid;
}

// The difference of the first two models shown, where their maps have the same tokens.
function differencePanel(views) {
  if (views.length < 2) return null;
  const [a, b] = views.map(([model, view]) => ({ model, map: chosenMap(view, model) }));
  if (!a.map || !b.map || JSON.stringify([a.map.rows, a.map.cols]) !== JSON.stringify([b.map.rows, b.map.cols])) {
    return null;
  }
  const weights = a.map.weights.map((row, t) => row.map((w, s) => w - b.map.weights[t][s]));
  const box = el("div", { class: "panel", "data-model": "difference" });
  box.appendChild(el("h2", {}, `${a.model.name} − ${b.model.name}`));
  box.appendChild(el("div", { class: "meta" }, "red: more weight in the first, blue: in the second"));
  box.appendChild(heatmap({ weights, rows: a.map.rows, cols: a.map.cols }, null, "difference", true));
  return box;
}

function controls() {
  const header = document.getElementById("controls");
  header.replaceChildren(el("h1", {}, DATA.title));
  const pick = el("select", { id: "sentence" });
  data().sentences.forEach((s, i) => pick.appendChild(el("option", { value: i }, `${i + 1}: ${s.src.slice(0, 60)}`)));
  pick.value = state.sentence;
  pick.addEventListener("change", () => { state.sentence = Number(pick.value); render(); });
  header.appendChild(pick);
  const mapChoice = el("select", { id: "map" });
  mapChoice.appendChild(el("option", { value: "forced" }, "teacher-forced map"));
  mapChoice.appendChild(el("option", { value: "decoding" }, "decoding map"));
  if (DATA.models.some((m) => m.layers)) {
    mapChoice.appendChild(el("option", { value: "encoder" }, "encoder self-attention"));
    mapChoice.appendChild(el("option", { value: "decoder" }, "decoder self-attention"));
  }
  mapChoice.value = state.map;
  mapChoice.addEventListener("change", () => { state.map = mapChoice.value; render(); });
  header.appendChild(mapChoice);
  const layers = Math.max(0, ...DATA.models.map((m) => m.layers || 0));
  if (layers) {
    const heads = Math.max(...DATA.models.map((m) => m.heads || 0));
    const layer = el("select", { id: "layer" });
    layer.appendChild(el("option", { value: "avg" }, "last layer, heads averaged"));
    for (let l = 0; l < layers; l++) layer.appendChild(el("option", { value: l }, `layer ${l + 1}`));
    layer.value = state.layer;
    layer.addEventListener("change", () => { state.layer = layer.value; render(); });
    const head = el("select", { id: "head" });
    head.appendChild(el("option", { value: "avg" }, "heads averaged"));
    for (let h = 0; h < heads; h++) head.appendChild(el("option", { value: h }, `head ${h + 1}`));
    head.value = state.head;
    head.addEventListener("change", () => { state.head = head.value; render(); });
    header.append(layer, head);
  }
  const gold = el("input", { type: "checkbox", id: "gold" });
  gold.checked = state.gold;
  gold.addEventListener("change", () => { state.gold = gold.checked; render(); });
  const goldLabel = el("label", {}, " gold links");
  goldLabel.prepend(gold);
  header.appendChild(goldLabel);
  for (const model of DATA.models) {
    const box = el("input", { type: "checkbox", "data-show": model.name });
    box.checked = state.shown.includes(model.name);
    box.addEventListener("change", () => {
      state.shown = DATA.models.map((m) => m.name).filter((name) =>
        document.querySelector(`input[data-show="${CSS.escape(name)}"]`).checked).slice(0, 4);
      render();
    });
    const label = el("label", {}, ` ${model.name}`);
    label.prepend(box);
    header.appendChild(label);
  }
  if (snapshots.length > 1) {
    const slider = el("input", { type: "range", id: "checkpoint", min: 0, max: snapshots.length - 1, value: state.snapshot });
    const label = el("label", { id: "checkpoint-label" }, ` ${data().checkpoint || "latest"}`);
    slider.addEventListener("input", () => { state.snapshot = Number(slider.value); render(); });
    label.prepend(slider);
    header.appendChild(label);
  }
  const svgButton = el("button", { id: "download-svg" }, "SVG");
  svgButton.addEventListener("click", () => download("svg"));
  const pngButton = el("button", { id: "download-png" }, "PNG");
  pngButton.addEventListener("click", () => download("png"));
  header.append(svgButton, pngButton);
}

// The maps on screen as one SVG (or a PNG drawn from it), side by side.
function composite() {
  const maps = [...document.querySelectorAll("#panels svg.map")];
  let x = 0, height = 0;
  const out = el("svg:svg", {});
  out.setAttribute("xmlns", SVG);
  const style = el("svg:style", {}, "text{font:11px sans-serif} rect.sure,rect.possible,rect.band{fill:none;stroke:#000}");
  out.appendChild(style);
  for (const map of maps) {
    const group = el("svg:g", { transform: `translate(${x},16)` });
    group.appendChild(el("svg:text", { x: 0, y: -4 }, map.dataset.model));
    for (const child of map.childNodes) group.appendChild(child.cloneNode(true));
    out.appendChild(group);
    x += Number(map.getAttribute("width")) + 16;
    height = Math.max(height, Number(map.getAttribute("height")) + 16);
  }
  out.setAttribute("width", x);
  out.setAttribute("height", height);
  return out;
}

function download(kind) {
  const text = new XMLSerializer().serializeToString(composite());
  const name = `attention-${state.sentence + 1}`;
  if (kind === "svg") return save(new Blob([text], { type: "image/svg+xml" }), `${name}.svg`);
  const image = new Image();
  image.onload = () => {
    const canvas = el("canvas", { width: image.width * 2, height: image.height * 2 });
    const context = canvas.getContext("2d");
    context.fillStyle = "#fff";
    context.fillRect(0, 0, canvas.width, canvas.height);
    context.scale(2, 2);
    context.drawImage(image, 0, 0);
    canvas.toBlob((blob) => save(blob, `${name}.png`));
  };
  image.src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(text);
}

function save(blob, name) {
  const link = el("a", { download: name, href: URL.createObjectURL(blob) });
  document.body.appendChild(link);
  link.click();
  link.remove();
}

// Live (the page served by scripts/serve.py): a text box; each sentence typed is translated by
// every model the server has loaded and added to the sentence picker. The request goes to the
// server the page came from (a relative path); a static page never makes one.
function liveControls() {
  if (!DATA.live) return;
  const header = document.getElementById("controls");
  const text = el("input", { type: "text", id: "live-src", size: 50, placeholder: "type a sentence",
                             maxlength: DATA.live.max_chars });
  const key = el("input", { type: "password", id: "live-key", size: 12, placeholder: "API key" });
  const go = el("button", { id: "live-go" }, "Translate");
  const submit = () => translateLive(text.value, key.value);
  go.addEventListener("click", submit);
  text.addEventListener("keydown", (event) => { if (event.key === "Enter") submit(); });
  header.append(text, ...(DATA.live.needs_key ? [key] : []), go);
}

async function translateLive(text, key) {
  if (!text.trim()) return;
  const headers = { "Content-Type": "application/json" };
  if (key) headers.Authorization = `Bearer ${key}`;
  const status = document.getElementById("source");
  status.textContent = "translating…";
  try {
    const response = await fetch(DATA.live.endpoint, { method: "POST", headers,
                                                       body: JSON.stringify({ src: text }) });
    const answer = await response.json();
    if (!response.ok) throw new Error(answer.error || response.statusText);
    DATA.models = answer.models;
    if (!DATA.sentences.length) state.shown = answer.models.slice(0, 4).map((m) => m.name);
    DATA.sentences.push(answer.sentence);
    state.sentence = DATA.sentences.length - 1;
    render();
  } catch (error) {
    status.textContent = `error: ${error.message}`;
  }
}

function render() {
  controls();
  liveControls();
  const current = sentence();
  if (!current) { // a live page before its first sentence
    document.getElementById("source").textContent = "Type a sentence and press Translate.";
    document.getElementById("panels").replaceChildren();
    return;
  }
  const source = document.getElementById("source");
  source.replaceChildren(el("div", {}, `source: ${current.src}`));
  if (current.ref !== null) source.appendChild(el("div", { class: "ref" }, `reference: ${current.ref}`));
  const panels = document.getElementById("panels");
  panels.replaceChildren();
  const views = DATA.models.filter((m) => state.shown.includes(m.name))
    .map((model) => [model, current.models[model.name]]);
  for (const [model, view] of views) panels.appendChild(panel(model, view, current.gold));
  const difference = differencePanel(views);
  if (difference) panels.appendChild(difference);
}

render();
