// The attention explorer: reads the JSON embedded in the page (<script id="data">) and draws SVG.
// No library, no request to any host: the page works from file://, offline, in a notebook and
// inside W&B.
//
// The controls are built once and only their values change afterwards, so that a control keeps
// the keyboard focus and a slider keeps the pointer while it is used; a change redraws the panels.
"use strict";

// The SVG namespace: a name, not a resource. Spelled in parts so that the page holds no URL at
// all (the test that no resource is fetched looks for any).
const SVG = ["http:", "", "www.w3.org", "2000", "svg"].join("/");
const DATA = unquantize(JSON.parse(document.getElementById("data").textContent));
// Panels side by side at most: a page may hold more models (a comparison of settings and seeds);
// the checkboxes choose which.
const SIDE_BY_SIDE = 4;
const snapshots = [...DATA.checkpoints, DATA]; // oldest first: the checkpoint slider's stops
const state = { snapshot: snapshots.length - 1, sentence: 0, map: "forced", layer: "last",
                head: "avg", gold: true, links: true, scale: "linear", zoom: 1,
                shown: DATA.models.slice(0, SIDE_BY_SIDE).map((m) => m.name) };
// What each map on screen shows (its tokens, geometry, weights), for hover and keyboard.
const maps = new WeakMap();
let cursor = null; // { svg, row, col }: the keyboard's cell

// Weights and coverage come as integers in units of 1 / DATA.quantum (page.py): back to numbers.
function unquantize(data) {
  const quantum = data.quantum || 1;
  const walk = (value) => {
    if (Array.isArray(value)) { value.forEach(walk); return; }
    if (!value || typeof value !== "object") return;
    for (const [key, item] of Object.entries(value)) {
      if ((key === "weights" || key === "coverage") && Array.isArray(item)) {
        value[key] = item.map((row) => row.map((w) => w / quantum));
      } else walk(item);
    }
  };
  if (quantum !== 1) walk(data);
  return data;
}

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

// ---- colours ------------------------------------------------------------------------------
// viridis, reversed (matplotlib's, at 0, 0.1, .., 1): perceptually uniform, and its 0 is a clear
// yellow, not white, so that a small weight is never mistaken for none. Exactly 0 is hatched.
const SEQUENTIAL = [[253, 231, 37], [189, 223, 38], [122, 209, 81], [68, 191, 112], [34, 168, 132],
  [33, 145, 140], [42, 120, 142], [53, 95, 141], [65, 68, 135], [72, 36, 117], [68, 1, 84]];
// RdBu (matplotlib's), for differences: blue below 0, red above, near-white at 0.
const DIVERGING = [[5, 48, 97], [32, 101, 171], [67, 147, 195], [144, 196, 221], [209, 229, 240],
  [246, 247, 247], [253, 219, 199], [243, 164, 129], [214, 96, 77], [177, 24, 43], [103, 0, 31]];

function interpolate(stops, x) {
  const position = Math.min(1, Math.max(0, x)) * (stops.length - 1);
  const low = Math.min(stops.length - 2, Math.floor(position)), f = position - low;
  const [a, b] = [stops[low], stops[low + 1]];
  return `rgb(${a.map((value, i) => Math.round(value + f * (b[i] - value))).join(",")})`;
}

// The scale: linear, or √w, which spreads near-uniform maps' small weights apart.
function scaled(w) { return state.scale === "sqrt" ? Math.sqrt(w) : w; }
function colour(w) { return interpolate(SEQUENTIAL, scaled(w)); }
function differenceColour(d) {
  return interpolate(DIVERGING, 0.5 + 0.5 * Math.sign(d) * scaled(Math.min(1, Math.abs(d))));
}

// A colour bar with its numbers: 0 .. 1 (or -1 .. 1 for a difference), ticks where the scale puts
// them, and the hatched swatch of an exact 0.
function colourBar(difference = false) {
  const width = 220, left = difference ? 12 : 72, svg = el("svg:svg", { width: left + width + 16,
    height: 34, class: "colourbar", role: "img",
    "aria-label": difference ? "colour scale of differences, −1 to 1" : "colour scale of weights, 0 to 1" });
  const steps = 64;
  for (let i = 0; i < steps; i++) {
    const x = i / (steps - 1);
    const fill = difference ? interpolate(DIVERGING, x) : interpolate(SEQUENTIAL, x);
    svg.appendChild(el("svg:rect", { x: left + (i * width) / steps, y: 2, width: width / steps + 0.5,
                                     height: 12, fill }));
  }
  const ticks = difference
    ? (state.scale === "sqrt" ? [-1, -0.5, -0.1, 0, 0.1, 0.5, 1] : [-1, -0.5, 0, 0.5, 1])
    : (state.scale === "sqrt" ? [0, 0.01, 0.05, 0.25, 0.5, 1] : [0, 0.25, 0.5, 0.75, 1]);
  for (const value of ticks) {
    const position = difference ? 0.5 + 0.5 * Math.sign(value) * scaled(Math.abs(value)) : scaled(value);
    const x = left + position * width;
    svg.appendChild(el("svg:line", { x1: x, x2: x, y1: 14, y2: 18, stroke: "#222" }));
    svg.appendChild(el("svg:text", { x, y: 30, "text-anchor": "middle" }, String(value)));
  }
  if (!difference) {
    svg.appendChild(el("svg:rect", { x: 2, y: 2, width: 12, height: 12, fill: "url(#exact-zero)",
                                     stroke: "#999" }));
    svg.appendChild(el("svg:text", { x: 18, y: 12 }, "exactly 0"));
  }
  return svg;
}

// ---- which map a panel draws ---------------------------------------------------------------
const MAP_NAMES = { forced: "teacher-forced", decoding: "decoding", encoder: "encoder self-attention",
                    decoder: "decoder self-attention" };

// The map a panel draws, with a sentence that says what it is (the menus and the map must agree):
// { ...map, rows, cols, causal, what } or { missing: why }.
function chosenMap(view, model) {
  if (state.map === "decoding") {
    if (!view.hyp_attention) return { missing: "no decoding attention for this sentence" };
    return { ...view.hyp_attention, rows: view.hyp_tokens, cols: view.src_tokens,
             what: "its own translation, while decoding" + (model.layers ? ", last layer, heads averaged" : "") };
  }
  const self = state.map === "encoder" || state.map === "decoder";
  const layers = self ? (state.map === "encoder" ? view.encoder_self : view.decoder_self) : view.heads;
  const rows = state.map === "encoder" ? view.src_tokens : view.tgt_tokens;
  const cols = state.map === "encoder" ? view.src_tokens : state.map === "decoder" ? view.decoder_inputs : view.src_tokens;
  const on = state.map === "encoder" ? "encoder self-attention"
    : state.map === "decoder" ? `decoder self-attention, teacher-forced on the ${view.forced_on}`
    : `teacher-forced on the ${view.forced_on}`;
  if (!model.layers) {
    if (self) return { missing: "no self-attention in this model (an RNN)" };
    return { ...view.forced, rows, cols, what: on };
  }
  if (!layers) { // an earlier validation on the slider keeps only the last layer's average
    if (self) return { missing: "self-attention is kept for the latest validation only: move the slider to its end" };
    const note = state.layer === "last" && state.head === "avg" ? ""
      : " (per-head maps are kept for the latest validation only)";
    return { ...view.forced, rows, cols, what: `${on}, last layer, heads averaged${note}` };
  }
  const l = state.layer === "last" ? layers.length - 1 : Number(state.layer);
  if (l >= layers.length) return { missing: `no layer ${l + 1} in this model (it has ${layers.length})` };
  const layerName = state.layer === "last" ? `last layer (${l + 1})` : `layer ${l + 1}`;
  let map;
  if (state.head === "avg") {
    // The last layer's average is what decoding reports (view.forced, with its AER and spread);
    // another layer's average comes with the data when the page has it.
    map = !self && l === layers.length - 1 ? view.forced
      : !self && view.layer_means ? view.layer_means[l] : averageHeads(layers[l]);
  } else {
    map = layers[l][Number(state.head)];
    if (!map) return { missing: `no head ${Number(state.head) + 1} in this model (it has ${layers[l].length})` };
  }
  const headName = state.head === "avg" ? "heads averaged" : `head ${Number(state.head) + 1}`;
  return { ...map, rows, cols, causal: state.map === "decoder", what: `${on}, ${layerName}, ${headName}` };
}

function averageHeads(layer) {
  const weights = layer[0].weights.map((row, t) =>
    row.map((_, s) => layer.reduce((sum, head) => sum + head.weights[t][s], 0) / layer.length));
  return { weights, entropy: weights.map(entropyOf), aer: null, spread: null };
}

function entropyOf(row) {
  const total = row.reduce((a, b) => a + b, 0) || 1;
  return row.reduce((sum, w) => (w > 0 ? sum - (w / total) * Math.log(w / total) : sum), 0);
}

// The running sum of a map's weights, row t: what steps 0..t gave each column.
function coverageOf(map) {
  if (map.coverage) return map.coverage; // a model's own map: summed before rounding
  let running = map.weights[0].map(() => 0);
  return map.weights.map((row) => (running = running.map((sum, s) => sum + row[s])));
}

// ---- the map -----------------------------------------------------------------------------
const LABEL_PX = 11; // a label needs this many pixels: smaller cells show every k-th token

function heatmap(map, gold, name, width, difference = false, links = null) {
  const rows = map.rows.length, cols = map.cols.length;
  // Room for the labels: the longest token (clipped at 14 characters), rotated 60° above.
  const longest = Math.max(1, ...map.rows.map((t) => clip(t).length), ...map.cols.map((t) => clip(t).length));
  const left = Math.max(64, Math.min(92, 12 + 6.5 * longest)), top = Math.min(72, 12 + 5.6 * longest);
  const entropyWidth = 40, coverageHeight = map.weights.length && !difference ? 36 : 0;
  const fit = Math.floor((width - left - entropyWidth - 12) / Math.max(cols, 1));
  const cell = Math.max(4, Math.min(28, fit)) * state.zoom;
  const every = Math.ceil(LABEL_PX / cell); // 1: every label
  const svg = el("svg:svg", { width: left + cols * cell + entropyWidth + 8,
                              height: top + rows * cell + coverageHeight + 8,
                              "data-model": name, class: "map", tabindex: 0, role: "img",
                              "aria-label": `attention map of ${name}: ${rows} rows (${map.rows.slice(0, 3).join(" ")} …) by ${cols} columns; the arrow keys move a cursor over its cells` });
  const zeros = map.zeros ? map.zeros.map((columns) => new Set(columns)) : null;
  const cells = el("svg:g", { class: "cells" });
  map.weights.forEach((row, t) => {
    row.forEach((w, s) => {
      const exact = !difference && zeros && zeros[t] && zeros[t].has(s);
      const rect = el("svg:rect", { x: left + s * cell, y: top + t * cell, width: cell, height: cell,
                                    fill: exact ? "url(#exact-zero)" : difference ? differenceColour(w) : colour(w),
                                    class: "cell", "data-row": t, "data-col": s, "data-w": w });
      if (exact) rect.setAttribute("data-zero", ""); // exactly 0, not merely small after rounding
      cells.appendChild(rect);
    });
  });
  svg.appendChild(cells);
  // The entropy of each row, a bar beside it; full width is a uniform row over what the row may
  // read: every column, or (causal self-attention) the t + 1 positions up to its own.
  if (map.entropy) {
    map.entropy.forEach((value, t) => {
      const readable = map.causal ? t + 1 : map.window ? windowSpan(map, t, cols).length : cols;
      const most = Math.log(Math.max(readable, 1));
      const bar = el("svg:rect", { x: left + cols * cell + 4, y: top + t * cell + (cell > 3 ? 1 : 0),
                                   width: most > 0 ? (entropyWidth * value) / most : 0,
                                   height: Math.max(1, cell - (cell > 3 ? 2 : 0)), fill: "#8c8c8c", class: "entropy" });
      bar.appendChild(el("svg:title", {}, `entropy ${value.toFixed(3)} nats (uniform over ${readable}: ${most.toFixed(3)})`));
      svg.appendChild(bar);
    });
  }
  map.rows.forEach((token, t) => {
    if (t % every) return;
    svg.appendChild(el("svg:text", { x: left - 4, y: top + t * cell + cell / 2 + 4, "text-anchor": "end",
                                     class: "token row", "data-row": t }, clip(token)));
  });
  map.cols.forEach((token, s) => {
    if (s % every) return;
    const x = left + s * cell + cell / 2 + 4, y = top - 4;
    svg.appendChild(el("svg:text", { x, y, transform: `rotate(-60 ${x} ${y})`, class: "token col",
                                     "data-col": s }, clip(token)));
  });
  if (map.window) drawWindow(svg, map, { left, top, cell, cols });
  if (gold && state.gold && !difference) drawGold(svg, gold, { left, top, cell, rows, cols });
  if (links && state.links && !difference) drawLinks(svg, links, { left, top, cell, rows, cols });
  if (coverageHeight) {
    svg.appendChild(el("svg:g", { class: "coverage", transform: `translate(0, ${top + rows * cell + 6})` }));
  }
  svg.appendChild(el("svg:rect", { class: "band", width: 0, height: 0, "data-band": "row" }));
  svg.appendChild(el("svg:rect", { class: "band", width: 0, height: 0, "data-band": "col" }));
  svg.appendChild(el("svg:rect", { class: "cursor", width: 0, height: 0 }));
  maps.set(svg, { name, map, left, top, cell, rows, cols, difference, coverageHeight,
                  coverage: coverageHeight ? coverageOf(map) : null });
  drawCoverage(svg, null);
  svg.addEventListener("mouseover", (event) => {
    const target = event.target;
    if (target.classList.contains("cell")) highlight(svg, Number(target.dataset.row), Number(target.dataset.col));
    else if (target.classList.contains("row")) highlight(svg, Number(target.dataset.row), null);
    else if (target.classList.contains("col")) highlight(svg, null, Number(target.dataset.col));
  });
  svg.addEventListener("mouseleave", () => { if (!cursor || cursor.svg !== svg) highlight(null, null, null); });
  svg.addEventListener("keydown", (event) => moveCursor(svg, event));
  svg.addEventListener("blur", () => { if (cursor && cursor.svg === svg) { cursor = null; drawCursor(); highlight(null, null, null); } });
  return svg;
}

function clip(token) { return token.length > 14 ? `${token.slice(0, 13)}…` : token; }

// The local window, [round(p_t) - D, round(p_t) + D] within the sentence, as its edges on each
// row, and (local-p) the predicted centre p_t as a tick.
function windowSpan(map, t, cols) {
  const centre = Math.round(map.window.centres[t]), size = map.window.size;
  const low = Math.max(0, centre - size), high = Math.min(cols - 1, centre + size);
  return Array.from({ length: Math.max(0, high - low + 1) }, (_, i) => low + i);
}

function drawWindow(svg, map, { left, top, cell, cols }) {
  const group = el("svg:g", { class: "window" });
  map.window.centres.forEach((centre, t) => {
    if (t >= map.rows.length) return;
    const span = windowSpan(map, t, cols);
    if (!span.length) return;
    const y = top + t * cell;
    for (const x of [left + span[0] * cell, left + (span[span.length - 1] + 1) * cell]) {
      group.appendChild(el("svg:line", { x1: x, x2: x, y1: y, y2: y + cell }));
    }
    const c = left + (centre + 0.5) * cell;
    group.appendChild(el("svg:line", { x1: c, x2: c, y1: y + cell * 0.3, y2: y + cell * 0.7, class: "centre" }));
  });
  svg.appendChild(group);
}

// Gold links: boxes on cells big enough to show the colour inside; a dot on small ones.
function drawGold(svg, gold, { left, top, cell, rows, cols }) {
  for (const [kind, links] of [["sure", gold.sure], ["possible", gold.possible]]) {
    for (const [s, t] of links) { // Pharaoh links are source-target
      if (t >= rows || s >= cols) continue;
      if (cell >= 10) { // a white halo under the black box: it shows on the darkest cells too
        for (const layer of ["halo", kind]) {
          svg.appendChild(el("svg:rect", { x: left + s * cell + 1.5, y: top + t * cell + 1.5,
                                           width: cell - 3, height: cell - 3, class: layer }));
        }
      } else {
        svg.appendChild(el("svg:circle", { cx: left + (s + 0.5) * cell, cy: top + (t + 0.5) * cell,
                                           r: Math.max(1, cell * 0.22), class: `${kind} dot` }));
      }
    }
  }
}

// Another aligner's links (explore --links): a cross in each linked cell, white under orange so
// that it shows on every colour of the map; unlike the gold's boxes, it can sit inside one.
function drawLinks(svg, links, { left, top, cell, rows, cols }) {
  const arm = Math.max(1.5, cell * 0.22);
  for (const [s, t] of links) { // Pharaoh links are source-target
    if (t >= rows || s >= cols) continue;
    const cx = left + (s + 0.5) * cell, cy = top + (t + 0.5) * cell;
    for (const layer of ["other-halo", "other"]) {
      const group = el("svg:g", { class: layer });
      group.appendChild(el("svg:line", { x1: cx - arm, y1: cy - arm, x2: cx + arm, y2: cy + arm }));
      group.appendChild(el("svg:line", { x1: cx - arm, y1: cy + arm, x2: cx + arm, y2: cy - arm }));
      svg.appendChild(group);
    }
  }
}

// Under the map: each source word's coverage (the weight it received so far) after the hovered
// row, or after the last row; the dashed line is 1, one full read.
function drawCoverage(svg, row) {
  const info = maps.get(svg);
  if (!info || !info.coverage || !info.coverage.length) return;
  const group = svg.querySelector("g.coverage");
  const t = row === null || row >= info.coverage.length ? info.coverage.length - 1 : row;
  const height = info.coverageHeight - 10;
  group.replaceChildren();
  info.coverage[t].forEach((value, s) => {
    const bar = (height * Math.min(value, 2)) / 2;
    const rect = el("svg:rect", { x: info.left + s * info.cell + (info.cell > 3 ? 1 : 0), y: height - bar,
                                  width: Math.max(1, info.cell - (info.cell > 3 ? 2 : 0)), height: bar,
                                  fill: value > 1.5 ? "#b2182b" : "#6c6c6c", class: "coverage-bar", "data-col": s });
    rect.appendChild(el("svg:title", {}, `${info.map.cols[s]}: coverage ${value.toFixed(3)} after step ${t + 1}`));
    group.appendChild(rect);
  });
  const one = height / 2;
  group.appendChild(el("svg:line", { x1: info.left, x2: info.left + info.cols * info.cell, y1: height - one,
                                     y2: height - one, class: "one" }));
  group.appendChild(el("svg:text", { x: info.left - 4, y: height - 12, "text-anchor": "end" }, "coverage"));
  group.appendChild(el("svg:text", { x: info.left - 4, y: height, "text-anchor": "end", class: "small" },
                       `to step ${t + 1}`));
}

// ---- hover and keyboard ------------------------------------------------------------------
function same(a, b) { return a.length === b.length && a.every((token, i) => token === b[i]); }

// A row, a column or a cell of the map ``origin`` (null: nothing): the same row lights up in every
// map whose rows are the same tokens, the same column in every map whose columns are (panels of
// decoding maps with different translations are not linked by position). The hovered tokens are
// red; the tokens on the other side are shaded by their weight, the heaviest in bold.
function highlight(origin, row, col) {
  const from = origin && maps.get(origin);
  for (const svg of document.querySelectorAll("#panels svg.map")) {
    const info = maps.get(svg);
    if (!info) continue;
    const r = from && row !== null && row < info.rows && same(info.map.rows, from.map.rows) ? row : null;
    const c = from && col !== null && col < info.cols && same(info.map.cols, from.map.cols) ? col : null;
    const band = (kind, attributes) => {
      const rect = svg.querySelector(`rect[data-band="${kind}"]`);
      for (const [key, value] of Object.entries(attributes || { width: 0, height: 0 })) rect.setAttribute(key, value);
    };
    band("row", r === null ? null : { x: info.left, y: info.top + r * info.cell, width: info.cols * info.cell, height: info.cell });
    band("col", c === null ? null : { x: info.left + c * info.cell, y: info.top, width: info.cell, height: info.rows * info.cell });
    // A row (or a cell) shades the columns by its weights; a column alone shades the rows.
    const weights = r !== null ? info.map.weights[r] : c !== null ? info.map.weights.map((w) => w[c]) : null;
    const heaviest = weights ? Math.max(...weights.map(Math.abs), 1e-9) : 1;
    for (const text of svg.querySelectorAll("text.token")) {
      const isRow = text.classList.contains("row");
      const index = Number(isRow ? text.dataset.row : text.dataset.col);
      const lit = isRow ? index === r : index === c;
      const shaded = weights && !lit && (r !== null ? !isRow : isRow);
      text.classList.toggle("lit", lit);
      text.style.fillOpacity = shaded ? String(0.25 + (0.75 * Math.abs(weights[index])) / heaviest) : "";
      text.classList.toggle("read", Boolean(shaded && Math.abs(weights[index]) === heaviest));
    }
    drawCoverage(svg, r);
    shadeText(svg, r, c, weights);
  }
  readout(from, row, col);
  document.body.dataset.row = row === null || !from ? "" : row;
  document.body.dataset.col = col === null || !from ? "" : col;
}

// The hovered cell's weight, in numbers (screen readers hear it: the element is aria-live).
function readout(info, row, col) {
  const out = document.getElementById("readout");
  if (!info || (row === null && col === null)) { out.textContent = "hover a cell, or focus a map and use the arrow keys"; return; }
  if (row !== null && col !== null) {
    const w = info.map.weights[row][col];
    const exact = info.map.zeros && info.map.zeros[row] && info.map.zeros[row].includes(col);
    out.textContent = `${info.name}: ${info.map.rows[row]} ← ${info.map.cols[col]} = ${exact ? "exactly 0" : w.toFixed(4)}`;
  } else if (row !== null) {
    const weights = info.map.weights[row];
    const best = weights.indexOf(Math.max(...weights));
    out.textContent = `${info.name}: ${info.map.rows[row]} reads ${info.map.cols[best]} most (${weights[best].toFixed(4)})`;
  } else {
    const total = info.map.weights.reduce((sum, w) => sum + w[col], 0);
    out.textContent = `${info.name}: ${info.map.cols[col]} receives ${total.toFixed(3)} in all`;
  }
}

function setCursor(svg, row, col) {
  const info = maps.get(svg);
  if (!info || !info.rows || !info.cols) return;
  cursor = { svg, row: Math.min(Math.max(row, 0), info.rows - 1), col: Math.min(Math.max(col, 0), info.cols - 1) };
  drawCursor();
  // A zoomed map scrolls in its panel: keep the cursor's cell in sight.
  svg.querySelector("rect.cursor").scrollIntoView({ block: "nearest", inline: "nearest" });
  highlight(svg, cursor.row, cursor.col);
}

function drawCursor() {
  for (const svg of document.querySelectorAll("#panels svg.map")) {
    const rect = svg.querySelector("rect.cursor"), info = maps.get(svg);
    const on = cursor && cursor.svg === svg;
    rect.setAttribute("x", on ? info.left + cursor.col * info.cell : 0);
    rect.setAttribute("y", on ? info.top + cursor.row * info.cell : 0);
    rect.setAttribute("width", on ? info.cell : 0);
    rect.setAttribute("height", on ? info.cell : 0);
  }
}

function moveCursor(svg, event) {
  const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
  const info = maps.get(svg);
  if (event.key === "Escape") { cursor = null; drawCursor(); highlight(null, null, null); return; }
  if (event.key === "Home" || event.key === "End") {
    event.preventDefault();
    setCursor(svg, cursor ? cursor.row : 0, event.key === "Home" ? 0 : info.cols - 1);
    return;
  }
  const move = moves[event.key];
  if (!move) return;
  event.preventDefault(); // not the page's scroll
  // The first press puts the cursor on the first cell; the next ones move it.
  if (!cursor || cursor.svg !== svg) { setCursor(svg, 0, 0); return; }
  setCursor(svg, cursor.row + move[0], cursor.col + move[1]);
}

// ---- attention on the text -----------------------------------------------------------------
// Under each map, its tokens as text: hover a row token (a target word) and the column tokens
// (the source words) are shaded by its weights, and the other way round; it reads better than a
// matrix past ~40 tokens.
function textView(svg) {
  const info = maps.get(svg);
  const box = el("div", { class: "textview" });
  for (const [kind, tokens] of [["col", info.map.cols], ["row", info.map.rows]]) {
    const line = el("p", { class: kind });
    line.appendChild(el("span", { class: "side" }, kind === "col" ? "columns: " : "rows: "));
    tokens.forEach((token, i) => {
      const word = el("span", { class: `word ${kind}`, "data-index": i }, token);
      word.addEventListener("mouseenter", () => highlight(svg, kind === "row" ? i : null, kind === "col" ? i : null));
      line.append(word, " ");
    });
    box.appendChild(line);
  }
  box.addEventListener("mouseleave", () => highlight(null, null, null));
  info.text = box;
  return box;
}

function shadeText(svg, row, col, weights) {
  const info = maps.get(svg);
  if (!info.text) return;
  const heaviest = weights ? Math.max(...weights.map(Math.abs), 1e-9) : 1;
  for (const word of info.text.querySelectorAll("span.word")) {
    const isRow = word.classList.contains("row"), index = Number(word.dataset.index);
    const lit = isRow ? index === row : index === col;
    // The hovered word keeps its own shade inside its outline (a cell's column is both).
    const shaded = weights && (row !== null ? !isRow : isRow);
    const w = shaded ? weights[index] : 0;
    word.classList.toggle("lit", lit);
    word.style.background = shaded ? (info.difference ? differenceColour(w) : colour(Math.abs(w))) : "";
    word.style.color = shaded && scaled(Math.abs(w)) > 0.55 ? "#fff" : "";
    word.title = shaded ? w.toFixed(4) : "";
    word.classList.toggle("read", Boolean(shaded && Math.abs(w) === heaviest));
  }
}

// ---- panels --------------------------------------------------------------------------------
// The attention's names as the config writes them: additive, scaled_dot, sparsemax, local_p, ...
function description(model) {
  const parts = [
    model.attention || model.scoring,
    model.normalizer && model.normalizer !== "softmax"
      ? (model.normalizer === "entmax" ? `entmax α = ${model.alpha ?? 1.5}` : model.normalizer) : null,
    model.window && model.window !== "global" ? `${model.window} D = ${model.window_size ?? 10}` : null,
    model.key_bias ? "key bias" : null,
    model.coverage ? "coverage" : null,
    model.input_feeding ? "input feeding" : null,
  ];
  return [model.architecture, ...parts, model.layers ? `${model.layers} layers × ${model.heads} heads` : null]
    .filter(Boolean).join(" · ");
}

function panel(model, view, gold, width) {
  const box = el("section", { class: "panel", "data-model": model.name, "aria-label": model.name });
  box.appendChild(el("h2", {}, `${model.name}`));
  box.appendChild(el("div", { class: "meta kind" }, description(model)));
  box.appendChild(el("div", { class: "hyp" }, `→ ${view.hypothesis || "(an empty translation)"}`));
  if (view.n_best.length > 1) {
    const list = el("ol", { class: "nbest" });
    for (const entry of view.n_best) list.appendChild(el("li", {}, `${entry.text} (${entry.score.toFixed(3)})`));
    box.appendChild(list);
  }
  const map = chosenMap(view, model);
  if (map.missing || map.rows.length === 0 || map.cols.length === 0) {
    box.appendChild(el("div", { class: "meta missing" }, map.missing || "no attention for an empty sentence"));
    return box;
  }
  const aer = map.aer === null || map.aer === undefined ? "" : ` · AER ${map.aer.toFixed(3)}`;
  box.appendChild(el("div", { class: "meta aer" }, `${map.what}${aer}`));
  const scroller = el("div", { class: "scroller" });
  const forced = state.map === "forced";
  const links = forced && sentence() ? sentence().links : null;
  const svg = heatmap(map, forced ? gold : null, model.name, width, false, links);
  scroller.appendChild(svg);
  box.appendChild(scroller);
  box.appendChild(textView(svg));
  if (map.spread) box.appendChild(spreadChart(map.spread));
  if (model.layers && state.map === "forced") {
    box.appendChild(view.heads ? thumbnails(view)
      : el("div", { class: "meta" }, "per-head thumbnails: kept for the latest validation only"));
  }
  return box;
}

// What the softmax saw: each score minus its row's mean (recovered exactly from the weights), as
// a histogram. Unscaled dot products spread wide (saturation); tanh keeps additive scores near.
function spreadChart(spread) {
  const figure = el("figure", { class: "spread" });
  const width = 8, height = 36, top = Math.max(1, ...spread.counts), n = spread.counts.length;
  const svg = el("svg:svg", { width: n * width + 24, height: height + 16, role: "img",
                              "aria-label": "histogram of each score minus its row's mean" });
  spread.counts.forEach((count, i) => {
    const bar = (height * count) / top;
    const rect = el("svg:rect", { x: 12 + i * width, y: height - bar, width: width - 1, height: bar, fill: "#777" });
    rect.appendChild(el("svg:title", {}, `score − row mean in [${spread.low + i}, ${spread.low + i + 1}): ${count} cells`));
    svg.appendChild(rect);
  });
  for (const value of [spread.low, 0, -spread.low]) {
    svg.appendChild(el("svg:text", { x: 12 + (value - spread.low) * width, y: height + 13, "text-anchor": "middle" },
                       value > 0 ? `+${value}` : String(value)));
  }
  figure.appendChild(svg);
  figure.appendChild(el("figcaption", {}, `score − its row's mean, in logits (nats); std ${spread.std.toFixed(2)}`));
  return figure;
}

// Every layer's and head's map, small, with its AER and mean entropy: click one to show it.
function thumbnails(view) {
  const grid = el("div", { class: "thumbs" });
  grid.style.gridTemplateColumns = `repeat(${view.heads[0].length}, auto)`;
  view.heads.forEach((layer, l) => layer.forEach((head, h) => {
    const figure = el("button", { class: "thumb", "data-layer": l, "data-head": h,
                                  "aria-label": `show layer ${l + 1}, head ${h + 1}` });
    const last = l === view.heads.length - 1 && state.layer === "last";
    if ((String(l) === state.layer || last) && String(h) === state.head) figure.classList.add("chosen");
    const rows = head.weights.length, cols = rows ? head.weights[0].length : 0;
    const size = Math.max(2, Math.min(6, Math.floor(60 / Math.max(rows, cols, 1))));
    const svg = el("svg:svg", { width: cols * size, height: rows * size, "aria-hidden": "true" });
    head.weights.forEach((row, t) => row.forEach((w, s) => svg.appendChild(
      el("svg:rect", { x: s * size, y: t * size, width: size, height: size, fill: colour(w) }))));
    figure.appendChild(svg);
    const meanEntropy = head.entropy.reduce((a, b) => a + b, 0) / Math.max(1, head.entropy.length);
    const aer = head.aer === null || head.aer === undefined ? "" : ` AER ${head.aer.toFixed(2)}`;
    figure.appendChild(el("span", {}, `L${l + 1} H${h + 1}${aer} · ent ${meanEntropy.toFixed(2)}`));
    figure.addEventListener("click", () => { state.layer = String(l); state.head = String(h); render(); });
    grid.appendChild(figure);
  }));
  return grid;
}

// The difference of the first two models shown, where their maps have the same tokens.
function comparable(views) {
  if (views.length < 2) return null;
  const [a, b] = views.map(([model, view]) => ({ model, map: chosenMap(view, model) }));
  if (a.map.missing || b.map.missing || !same(a.map.rows, b.map.rows) || !same(a.map.cols, b.map.cols)) {
    return null;
  }
  return [a, b];
}

function differencePanel(views, width) {
  const pair = comparable(views);
  if (!pair) return null;
  const [a, b] = pair;
  const weights = a.map.weights.map((row, t) => row.map((w, s) => w - b.map.weights[t][s]));
  const box = el("section", { class: "panel", "data-model": "difference", "aria-label": "difference" });
  box.appendChild(el("h2", {}, `${a.model.name} − ${b.model.name}`));
  box.appendChild(el("div", { class: "meta" }, "red: more weight in the first, blue: in the second"));
  box.appendChild(colourBar(true));
  const scroller = el("div", { class: "scroller" });
  const svg = heatmap({ weights, rows: a.map.rows, cols: a.map.cols }, null, "difference", width, true);
  svg.dataset.title = `${a.model.name} − ${b.model.name} (red: more in ${a.model.name})`;
  scroller.appendChild(svg);
  box.append(scroller, textView(svg));
  return box;
}

// ---- layout --------------------------------------------------------------------------------
// Panels in a grid: from 1280 px up to three side by side (two models and their difference in
// one row; four models in a 3 + 2 grid); from 900 px two; below, one under another.
function layout(count) {
  const available = Math.max(320, document.documentElement.clientWidth - 32);
  const columns = Math.max(1, Math.min(count, available >= 1248 ? 3 : available >= 868 ? 2 : 1));
  const gap = 16;
  return { columns, width: Math.floor((available - gap * (columns - 1)) / columns) - 18 };
}

// ---- controls, built once -----------------------------------------------------------------
function labelled(text, control) {
  const label = el("label", {}, `${text} `);
  label.appendChild(control);
  return label;
}

function select(id, options, onChange) {
  const node = el("select", { id });
  for (const [value, text] of options) node.appendChild(el("option", { value }, text));
  node.addEventListener("change", () => onChange(node.value));
  return node;
}

function buildControls() {
  const header = document.getElementById("controls");
  header.replaceChildren(el("h1", {}, DATA.title));
  const pick = select("sentence", [], (value) => { state.sentence = Number(value); cursor = null; render(); });
  header.appendChild(labelled("sentence", pick));
  const kinds = [["forced", "teacher-forced"], ["decoding", "decoding"]];
  if (DATA.models.some((m) => m.layers)) kinds.push(["encoder", "encoder self-attention"], ["decoder", "decoder self-attention"]);
  header.appendChild(labelled("map", select("map", kinds, (value) => { state.map = value; render(); })));
  const layers = Math.max(0, ...DATA.models.map((m) => m.layers || 0));
  if (layers) {
    const heads = Math.max(...DATA.models.map((m) => m.heads || 0));
    const layerOptions = [["last", "last layer"], ...Array.from({ length: layers }, (_, l) => [String(l), `layer ${l + 1}`])];
    const headOptions = [["avg", "heads averaged"], ...Array.from({ length: heads }, (_, h) => [String(h), `head ${h + 1}`])];
    header.appendChild(labelled("layer", select("layer", layerOptions, (value) => { state.layer = value; render(); })));
    header.appendChild(labelled("head", select("head", headOptions, (value) => { state.head = value; render(); })));
  }
  header.appendChild(labelled("scale", select("scale", [["linear", "linear"], ["sqrt", "√ weight"]],
                                              (value) => { state.scale = value; render(); })));
  header.appendChild(labelled("zoom", select("zoom", [["1", "fit"], ["2", "2×"], ["4", "4×"]],
                                             (value) => { state.zoom = Number(value); render(); })));
  const gold = el("input", { type: "checkbox", id: "gold" });
  gold.addEventListener("change", () => { state.gold = gold.checked; render(); });
  const goldLabel = el("label", {}, " gold links");
  goldLabel.prepend(gold);
  header.appendChild(goldLabel);
  if (DATA.links_name) {
    const links = el("input", { type: "checkbox", id: "links" });
    links.addEventListener("change", () => { state.links = links.checked; render(); });
    const linksLabel = el("label", {}, ` ${DATA.links_name} links (×)`);
    linksLabel.prepend(links);
    header.appendChild(linksLabel);
  }
  for (const model of DATA.models) {
    const box = el("input", { type: "checkbox", "data-show": model.name });
    box.addEventListener("change", () => {
      state.shown = DATA.models.map((m) => m.name).filter((name) =>
        document.querySelector(`input[data-show="${CSS.escape(name)}"]`).checked).slice(0, SIDE_BY_SIDE);
      render();
    });
    const label = el("label", {}, ` ${model.name}`);
    label.prepend(box);
    header.appendChild(label);
  }
  // More models than fit side by side: say how many are shown and why the other boxes wait.
  if (DATA.models.length > SIDE_BY_SIDE) header.appendChild(el("span", { id: "shown-count", class: "meta" }));
  if (snapshots.length > 1) {
    const slider = el("input", { type: "range", id: "checkpoint", min: 0, max: snapshots.length - 1,
                                 value: state.snapshot, "aria-label": "validation checkpoint" });
    slider.addEventListener("input", () => { state.snapshot = Number(slider.value); render(); });
    const label = el("label", { id: "checkpoint-label" }, "checkpoint ");
    label.append(slider, el("span", { id: "checkpoint-name" }));
    header.appendChild(label);
  }
  const svgButton = el("button", { id: "download-svg" }, "SVG");
  svgButton.addEventListener("click", () => download("svg"));
  const pngButton = el("button", { id: "download-png" }, "PNG");
  pngButton.addEventListener("click", () => download("png"));
  header.append(svgButton, pngButton);
  liveControls(header);
  const legend = el("div", { id: "legend" });
  legend.append(colourBar(), el("output", { id: "readout", "aria-live": "polite" }));
  header.appendChild(legend);
}

// The controls' values from the state; only the sentence list is rebuilt, and only when it changes.
function syncControls() {
  const pick = document.getElementById("sentence");
  const labels = data().sentences.map((s, i) => `${i + 1}: ${s.src.length > 60 ? `${s.src.slice(0, 59)}…` : s.src}`);
  if (pick.options.length !== labels.length || [...pick.options].some((o, i) => o.text !== labels[i])) {
    pick.replaceChildren(...labels.map((text, i) => el("option", { value: i }, text)));
  }
  state.sentence = Math.min(state.sentence, Math.max(0, labels.length - 1));
  pick.value = state.sentence;
  document.getElementById("map").value = state.map;
  for (const id of ["layer", "head"]) {
    const node = document.getElementById(id);
    if (node) node.value = state[id];
  }
  document.getElementById("scale").value = state.scale;
  document.getElementById("zoom").value = String(state.zoom);
  document.getElementById("gold").checked = state.gold;
  const links = document.getElementById("links");
  if (links) links.checked = state.links;
  const full = state.shown.length >= SIDE_BY_SIDE;
  for (const box of document.querySelectorAll("input[data-show]")) {
    box.checked = state.shown.includes(box.dataset.show);
    // With as many panels as fit shown, the other boxes wait: untick one to choose another.
    box.disabled = full && !box.checked;
    box.parentElement.title = box.disabled ? `${SIDE_BY_SIDE} models at most side by side: untick one first` : "";
  }
  const count = document.getElementById("shown-count");
  if (count) count.textContent = ` ${state.shown.length} of ${DATA.models.length} shown (${SIDE_BY_SIDE} at most side by side)`;
  const slider = document.getElementById("checkpoint");
  if (slider) {
    if (Number(slider.value) !== state.snapshot) slider.value = state.snapshot;
    document.getElementById("checkpoint-name").textContent = ` ${data().checkpoint || "latest"}`;
  }
  // The colour bar follows the scale.
  const legend = document.getElementById("legend");
  legend.replaceChild(colourBar(), legend.querySelector("svg.colourbar"));
}

// ---- export -------------------------------------------------------------------------------
const EXPORT_STYLE = "text{font:11px sans-serif;fill:#222} text.small{font-size:9px}"
  + " rect.halo{fill:none;stroke:#fff;stroke-width:3} rect.sure,rect.possible{fill:none;stroke:#000;stroke-width:1.5}"
  + " rect.possible,circle.possible{stroke-dasharray:2 2;stroke-width:1} circle.sure{fill:#000} circle.possible{fill:none;stroke:#000}"
  + " g.window line{stroke:#d6006e;stroke-width:1.5} g.coverage line.one{stroke:#333;stroke-dasharray:3 2}"
  + " g.other-halo line{stroke:#fff;stroke-width:3.5;stroke-linecap:round} g.other line{stroke:#e8590c;stroke-width:1.75;stroke-linecap:round}";

// The maps on screen as one SVG (or a PNG drawn from it), side by side, with the colour bar: as
// they read without a pointer (no hover bands, no cursor, no faded labels).
function composite() {
  const svgs = [...document.querySelectorAll("#panels svg.map")];
  const out = el("svg:svg", {});
  out.setAttribute("xmlns", SVG);
  out.appendChild(el("svg:style", {}, EXPORT_STYLE));
  out.appendChild(document.querySelector("svg defs").cloneNode(true)); // the hatching of exact zeros
  const bars = [colourBar()];
  if (svgs.some((svg) => svg.dataset.model === "difference")) bars.push(colourBar(true));
  let barX = 0;
  for (const bar of bars) {
    const group = el("svg:g", { class: "colourbar", transform: `translate(${barX},0)` });
    group.append(...bar.childNodes);
    out.appendChild(group);
    barX += Number(bar.getAttribute("width")) + 24;
  }
  // The screen's grid: as many maps a row as the panels have columns.
  const columns = Math.max(1, Number((document.getElementById("panels").style.gridTemplateColumns.match(/repeat\((\d+)/) || [0, 1])[1]));
  let x = 0, y = 52, rowHeight = 0, width = barX;
  svgs.forEach((svg, i) => {
    if (i && i % columns === 0) { x = 0; y += rowHeight + 16; rowHeight = 0; }
    const group = el("svg:g", { transform: `translate(${x},${y})` });
    group.appendChild(el("svg:text", { x: 0, y: -4 }, svg.dataset.title || svg.dataset.model));
    for (const child of svg.childNodes) {
      const copy = child.cloneNode(true);
      if (copy.matches && copy.matches("rect.band, rect.cursor")) continue;
      for (const text of copy.querySelectorAll ? copy.querySelectorAll("text") : []) text.removeAttribute("style");
      if (copy.tagName === "text") { copy.removeAttribute("style"); copy.removeAttribute("class"); }
      group.appendChild(copy);
    }
    out.appendChild(group);
    x += Number(svg.getAttribute("width")) + 16;
    width = Math.max(width, x);
    rowHeight = Math.max(rowHeight, Number(svg.getAttribute("height")) + 16);
  });
  out.setAttribute("width", width);
  out.setAttribute("height", y + rowHeight);
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
function liveControls(header) {
  if (!DATA.live) return;
  const text = el("input", { type: "text", id: "live-src", size: 50, placeholder: "type a sentence",
                             maxlength: DATA.live.max_chars, "aria-label": "sentence to translate" });
  const key = el("input", { type: "password", id: "live-key", size: 12, placeholder: "API key",
                            "aria-label": "API key" });
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
    const known = DATA.models.map((m) => m.name).join("\n");
    DATA.models = answer.models;
    if (!DATA.sentences.length) state.shown = answer.models.slice(0, SIDE_BY_SIDE).map((m) => m.name);
    DATA.sentences.push(answer.sentence);
    state.sentence = DATA.sentences.length - 1;
    if (known !== DATA.models.map((m) => m.name).join("\n")) buildControls(); // new model checkboxes
    render();
  } catch (error) {
    status.textContent = `error: ${error.message}`;
  }
}

function render() {
  syncControls();
  cursor = null;
  const current = sentence();
  const panels = document.getElementById("panels");
  if (!current) { // a live page before its first sentence
    document.getElementById("source").textContent = "Type a sentence and press Translate.";
    panels.replaceChildren();
    return;
  }
  const source = document.getElementById("source");
  source.replaceChildren(el("div", {}, `source: ${current.src}`));
  if (current.ref !== null) source.appendChild(el("div", { class: "ref" }, `reference: ${current.ref}`));
  if (current.links) {
    const aer = current.links_aer === null || current.links_aer === undefined ? "" : ` · AER ${current.links_aer.toFixed(3)}`;
    const shown = current.links.map(([s, t]) => `${s}-${t}`).join(" ") || "(no links)";
    source.appendChild(el("div", { class: "links" }, `${DATA.links_name} links (×): ${shown}${aer}`));
  }
  const views = DATA.models.filter((m) => state.shown.includes(m.name))
    .map((model) => [model, current.models[model.name]]).filter(([, view]) => view);
  if (!views.length) {
    panels.replaceChildren(el("p", { class: "meta missing" }, "No model is shown: tick one above."));
    return;
  }
  const count = views.length + (comparable(views) ? 1 : 0);
  const { columns, width } = layout(count);
  panels.style.gridTemplateColumns = `repeat(${columns}, minmax(0, 1fr))`;
  panels.replaceChildren(...views.map(([model, view]) => panel(model, view, current.gold, width)));
  const difference = differencePanel(views, width);
  if (difference) panels.appendChild(difference);
  readout(null, null, null);
}

buildControls();
render();
performance.mark("explorer-rendered"); // the first render's end, for benchmarks/explorer_pages.py
let resizing = null;
window.addEventListener("resize", () => { clearTimeout(resizing); resizing = setTimeout(render, 150); });
