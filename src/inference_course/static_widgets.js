// The book's widgets without a kernel (inference_course.static_widgets writes the HTML).
// Each widget is a <div class="ii-widget"> holding its controls, an output box and its data as
// JSON. A frame viewer shows the frame Python computed for the chosen setting; a calculator
// calls one of the renderers below, whose formulas mirror the library's Python (the browser
// tests compare the two on a grid of inputs). Included once per widget: the first copy defines
// everything, later copies only start their own widget.
(function () {
  "use strict";
  const VERSION = 1;
  if (!(window.IIWidgets && window.IIWidgets.version === VERSION)) {
    window.IIWidgets = define();
  }
  // Start every widget on the page so far (this copy's own is the one just before it).
  document.querySelectorAll(".ii-widget:not([data-ii-ready])").forEach((w) => window.IIWidgets.init(w));

  function define() {
    const W = { version: VERSION, renderers: {}, formulas: {} };

    // --- number formatting, as Python's f"{x:,.Nf}" -----------------------------------------
    W.fmt = (x, digits = 0, comma = true) =>
      Number(x).toLocaleString("en-US", {
        minimumFractionDigits: digits, maximumFractionDigits: digits, useGrouping: comma,
      });
    W.pyfloat = (x) => Number.isInteger(x) ? x.toFixed(1) : String(x);  // Python's str() of a float
    W.esc = (s) => String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");

    // --- controls ---------------------------------------------------------------------------
    // Every control holds an index into its options; checkboxes are [false, true]; a "multi"
    // control is a group of checkboxes whose index is a bitmask over its options.
    function readIndex(el) {
      if (el.dataset.iiKind === "checkbox") return el.querySelector("input").checked ? 1 : 0;
      if (el.dataset.iiKind === "multi") {
        return [...el.querySelectorAll("input")].reduce((m, box, i) => m + (box.checked ? 1 << i : 0), 0);
      }
      return Number(el.querySelector("input, select").value);
    }

    function setting(root, spec) {
      const index = {}, value = {};
      for (const c of spec.controls) {
        const el = root.querySelector(`[data-ii-name="${c.name}"]`);
        const i = readIndex(el);
        index[c.name] = i;
        value[c.name] = c.kind === "multi" ? c.options.filter((_, k) => i & (1 << k)) : c.options[i];
        const shown = el.querySelector("output");
        if (shown) shown.textContent = c.labels[i];
      }
      return { index, value };
    }

    W.init = function (root) {
      if (root.dataset.iiReady) return;
      root.dataset.iiReady = "1";
      const spec = JSON.parse(root.querySelector("script.ii-data").textContent);
      const out = root.querySelector(".ii-output");
      const update = () => {
        const s = setting(root, spec);
        if (spec.kind === "frames") {
          const key = spec.controls.map((c) => s.index[c.name]).join(",");
          const i = spec.index[key];
          out.innerHTML = i === undefined ? "<p>(no frame was computed for this setting)</p>" : spec.frames[i];
        } else {
          const width = Math.max(300, Math.min(out.clientWidth || 640, 720));
          out.innerHTML = W.renderers[spec.renderer](s.value, spec.data, width);
        }
        root.dataset.iiSetting = JSON.stringify(s.index);
      };
      root.addEventListener("input", update);
      root.addEventListener("change", update);
      root.addEventListener("click", (e) => {
        const step = e.target.closest("button[data-ii-step]");
        if (!step) return;
        const input = step.parentElement.querySelector("input[type=range]");
        const v = Number(input.value) + Number(step.dataset.iiStep);
        input.value = String(Math.max(Number(input.min), Math.min(Number(input.max), v)));
        update();
      });
      let width = root.clientWidth;
      window.addEventListener("resize", () => {
        if (spec.kind !== "frames" && root.clientWidth !== width) { width = root.clientWidth; update(); }
      });
      update();
    };

    // --- a small SVG chart: lines, markers, reference lines; linear or log axes --------------
    function ticksLinear(lo, hi, n = 5) {
      const raw = (hi - lo) / n, mag = 10 ** Math.floor(Math.log10(raw || 1));
      const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw) || raw;
      const out = [];
      for (let v = Math.ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toPrecision(12));
      return out;
    }
    function ticksLog(lo, hi) {
      const out = [];
      for (let e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e++) {
        if (10 ** e >= lo * 0.999 && 10 ** e <= hi * 1.001) out.push(10 ** e);
      }
      return out;
    }
    const tickLabel = (v) => (Math.abs(v) >= 1e4 || (Math.abs(v) < 1e-2 && v !== 0)
      ? v.toExponential(0).replace("e+", "e") : String(+v.toPrecision(6)));

    // spec: {width, height, title, xlabel, ylabel, xlog, ylog, xticks:[{v,label}], series:[{x,y,label,
    // color, dash, marker}], hlines/vlines:[{v,label,color,dash}], points:[{x,y,label,color,marker}]}
    W.chart = function (c) {
      const width = c.width || 640, height = c.height || 300, font = 13;
      const m = { l: 58, r: 24, t: c.title ? 26 : 10, b: 44 };
      const xs = c.series.flatMap((s) => s.x).concat((c.vlines || []).map((l) => l.v));
      const ys = c.series.flatMap((s) => s.y).concat((c.hlines || []).map((l) => l.v),
        (c.points || []).map((p) => p.y)).filter((v) => isFinite(v) && (!c.ylog || v > 0));
      let [x0, x1] = [Math.min(...xs), Math.max(...xs)];
      let [y0, y1] = [Math.min(...ys), Math.max(...ys)];
      if (c.ymin !== undefined) y0 = c.ymin;
      if (!c.ylog) { const pad = (y1 - y0) * 0.05 || 1; y0 = c.ymin !== undefined ? y0 : y0 - pad; y1 += pad; }
      else { y0 /= 1.5; y1 *= 1.5; }
      const tx = (v) => c.xlog ? Math.log10(v) : v, ty = (v) => c.ylog ? Math.log10(v) : v;
      const X = (v) => m.l + (tx(v) - tx(x0)) / ((tx(x1) - tx(x0)) || 1) * (width - m.l - m.r);
      const Y = (v) => height - m.b - (ty(v) - ty(y0)) / ((ty(y1) - ty(y0)) || 1) * (height - m.t - m.b);
      const parts = [];
      const text = (x, y, s, attrs = "") =>
        parts.push(`<text x="${x.toFixed(1)}" y="${y.toFixed(1)}" font-size="${font}" ${attrs}>${W.esc(s)}</text>`);
      // axes and ticks
      parts.push(`<line x1="${m.l}" y1="${height - m.b}" x2="${width - m.r}" y2="${height - m.b}" stroke="#333"/>`);
      parts.push(`<line x1="${m.l}" y1="${m.t}" x2="${m.l}" y2="${height - m.b}" stroke="#333"/>`);
      const xt = c.xticks || (c.xlog ? ticksLog(x0, x1) : ticksLinear(x0, x1)).map((v) => ({ v, label: tickLabel(v) }));
      let lastRight = -Infinity;
      for (const t of xt) {
        const x = X(t.v), w = t.label.length * font * 0.6;
        parts.push(`<line x1="${x}" y1="${height - m.b}" x2="${x}" y2="${height - m.b + 4}" stroke="#333"/>`);
        if (x - w / 2 > lastRight + 4) { text(x, height - m.b + 18, t.label, 'text-anchor="middle"'); lastRight = x + w / 2; }
      }
      for (const v of (c.ylog ? ticksLog(y0, y1) : ticksLinear(y0, y1))) {
        const y = Y(v);
        parts.push(`<line x1="${m.l - 4}" y1="${y}" x2="${m.l}" y2="${y}" stroke="#333"/>`);
        parts.push(`<line x1="${m.l}" y1="${y}" x2="${width - m.r}" y2="${y}" stroke="#eee"/>`);
        text(m.l - 6, y + 4, tickLabel(v), 'text-anchor="end"');
      }
      if (c.xlabel) text((m.l + width - m.r) / 2, height - 8, c.xlabel, 'text-anchor="middle"');
      if (c.ylabel) text(14, (m.t + height - m.b) / 2, c.ylabel,
        `text-anchor="middle" transform="rotate(-90 14 ${(m.t + height - m.b) / 2})"`);
      if (c.title) text((m.l + width - m.r) / 2, 17, c.title, 'text-anchor="middle" font-weight="600"');
      const dash = (d) => d ? ` stroke-dasharray="${d}"` : "";
      for (const l of c.hlines || []) {
        parts.push(`<line x1="${m.l}" y1="${Y(l.v)}" x2="${width - m.r}" y2="${Y(l.v)}" stroke="${l.color || "#777"}"${dash(l.dash)}/>`);
      }
      for (const l of c.vlines || []) {
        parts.push(`<line x1="${X(l.v)}" y1="${m.t}" x2="${X(l.v)}" y2="${height - m.b}" stroke="${l.color || "#777"}"${dash(l.dash)}/>`);
      }
      const marker = (x, y, kind, color, r = 3.5) => kind === "star"
        ? `<text x="${x}" y="${y + 6}" font-size="20" text-anchor="middle" fill="${color}">★</text>`
        : kind === "square" ? `<rect x="${x - r}" y="${y - r}" width="${2 * r}" height="${2 * r}" fill="${color}"/>`
          : `<circle cx="${x}" cy="${y}" r="${r}" fill="${color}"/>`;
      for (const s of c.series) {
        const pts = s.x.map((x, i) => [X(x), Y(s.y[i])]);
        parts.push(`<polyline fill="none" stroke="${s.color}" stroke-width="2"${dash(s.dash)} points="${pts.map((p) => p.map((v) => v.toFixed(1)).join(",")).join(" ")}"/>`);
        if (s.marker) for (const [x, y] of pts) parts.push(marker(x, y, s.marker, s.color));
      }
      for (const p of c.points || []) parts.push(marker(X(p.x), Y(p.y), p.marker, p.color));
      const legend = [...c.series, ...(c.vlines || []), ...(c.hlines || []), ...(c.points || [])]
        .filter((s) => s.label).map((s) => `<span class="ii-key"><span class="ii-swatch" style="border-top:3px ${s.dash ? "dashed" : "solid"} ${s.color || "#777"}"></span>${W.esc(s.label)}</span>`);
      return `<svg class="ii-chart" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" role="img"` +
        ` aria-label="${W.esc(c.title || c.ylabel || "chart")}">${parts.join("")}</svg>` +
        (legend.length ? `<div class="ii-legend">${legend.join("")}</div>` : "");
    };

    // --- the library's formulas (the Python they mirror is named beside each) ---------------
    const F = W.formulas;
    // kv_cache.kv_cache_bytes
    F.kv_cache_bytes = (cfg, seqLen, batch = 1, bytesPerElem = 2) =>
      2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * seqLen * batch * bytesPerElem;
    // roofline.Machine.compute_flops, bytes_per_param, decode_step_time, predict_decode_tok_s,
    // predict_ttft, critical_batch, fits
    F.bytes_per_param = (dtypes, dtype) => dtypes[dtype][0];
    F.compute_flops = (m, dtypes, dtype) => {
      const compute = dtypes[dtype][1];
      return compute in m.flops ? m.flops[compute] : m.flops.fp32;
    };
    F.decode_step_time = (m, dtypes, params, dtype, batch = 1, kvBytes = 0) => Math.max(
      (params * F.bytes_per_param(dtypes, dtype) + kvBytes) / m.bandwidth,
      2 * params * batch / F.compute_flops(m, dtypes, dtype));
    F.predict_decode_tok_s = (m, dtypes, params, dtype, batch = 1, kvBytes = 0) =>
      batch / F.decode_step_time(m, dtypes, params, dtype, batch, kvBytes);
    F.predict_ttft = (m, dtypes, params, promptLen, dtype, batch = 1) => Math.max(
      2 * params * promptLen * batch / F.compute_flops(m, dtypes, dtype),
      params * F.bytes_per_param(dtypes, dtype) / m.bandwidth);
    F.critical_batch = (m, dtypes, dtype) =>
      F.compute_flops(m, dtypes, dtype) / m.bandwidth * F.bytes_per_param(dtypes, dtype) / 2;
    F.fits = (m, dtypes, params, dtype, kvBytes = 0) =>
      m.memory === null || params * F.bytes_per_param(dtypes, dtype) + kvBytes <= m.memory;
    // kv_memory.values_per_token, kv_bytes, weight_bytes
    F.values_per_token = (s) => s.layers * (s.latent ? s.latent : 2 * s.kv_heads * s.head_dim);
    F.kv_bytes = (s, context, batch = 1, bytesPerValue = 2) => F.values_per_token(s) * bytesPerValue * context * batch;
    F.weight_bytes = (s, bytesPerParam = 2) => s.params * bytesPerParam;
    // speculative.expected_tokens_per_pass, expected_speedup, best_gamma
    F.expected_tokens_per_pass = (alpha, gamma) => alpha === 1 ? gamma + 1 : (1 - alpha ** (gamma + 1)) / (1 - alpha);
    F.expected_speedup = (alpha, gamma, c) => F.expected_tokens_per_pass(alpha, gamma) / (gamma * c + 1);
    F.best_gamma = (alpha, c, maxGamma = 32) => {
      let best = 0;  // Python's max() keeps the first of equal values
      for (let g = 1; g <= maxGamma; g++) if (F.expected_speedup(alpha, g, c) > F.expected_speedup(alpha, best, c)) best = g;
      return best;
    };

    // --- the renderers: what each calculator shows -------------------------------------------
    const R = W.renderers;
    R.kv_sizer = (v, d) => {
      const size = F.kv_cache_bytes(d.cfg, v.context, v.batch, d.bytes[v.dtype]);
      return `<p class="ii-result">${v.batch} × ${W.fmt(v.context)} tokens in ${v.dtype}: ${W.fmt(size)} bytes = ${W.fmt(size / 2 ** 30, 2)} GiB</p>`;
    };

    R.gpu_calculator = (v, d) => {
      const m = d.chips[v.chip], p = d.params[v.model], dt = d.dtypes;
      const size = p * F.bytes_per_param(dt, v.weights);
      const one = F.predict_decode_tok_s(m, dt, p, v.weights);
      const many = F.predict_decode_tok_s(m, dt, p, v.weights, v.batch);
      const crit = F.critical_batch(m, dt, v.weights);
      const fit = F.fits(m, dt, p, v.weights) ? "yes" : "<b>no</b>: needs several chips";
      const rows = [
        ["weights", `${W.fmt(size / 1e9, 1)} GB (fits: ${fit})`],
        ["decode, batch 1", `${W.fmt(one, 1)} tokens/s (${W.fmt(1e3 / one, 2)} ms per token)`],
      ];
      if (v.batch > 1) {
        rows.push([`decode, batch ${v.batch}`, `${W.fmt(many)} tokens/s in all, ${W.fmt(many / v.batch, 1)} per sequence` +
          ` (${v.batch > crit ? "compute" : "memory"}-bound)`]);
      }
      rows.push([`TTFT, ${W.fmt(v.prompt_len)}-token prompt`, `${W.fmt(F.predict_ttft(m, dt, p, v.prompt_len, v.weights) * 1e3, 1)} ms`]);
      rows.push(["critical batch", W.fmt(crit)]);
      return `<table class="ii-table">${rows.map(([k, x]) => `<tr><td>${k}</td><td>${x}</td></tr>`).join("")}</table>`;
    };

    const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"];
    const DASHES = ["", "6 3", "", "2 3", "", "6 3"];
    R.memory_calculator = (v, d, width) => {
      const names = v.names.length ? v.names : Object.keys(d.specs);
      const bpv = d.bytes[v.kind], GB = d.GB, w8 = v.include_weights ? 1 : 0;
      const series = names.map((n, i) => ({
        label: n, color: COLORS[i % 6], dash: DASHES[i % 6], marker: "circle",
        x: d.contexts, y: d.contexts.map((c) => (F.kv_bytes(d.specs[n], c, v.batch, bpv) + w8 * F.weight_bytes(d.specs[n])) / GB),
      }));
      const caps = Object.entries(d.gpus).map(([label, cap], i) => ({ v: cap / GB, label, color: "#000", dash: ["2 3", "6 3", "8 3 2 3"][i % 3] }));
      const what = v.include_weights ? "weights + KV cache" : "KV cache";
      const chart = W.chart({
        width, height: 320, xlog: true, ylog: true, title: `batch ${v.batch}, ${v.kind}`,
        xlabel: "context (tokens)", ylabel: `${what} (GB)`, series, hlines: caps,
        vlines: [{ v: v.context, color: "#999" }],
        xticks: d.contexts.map((c) => ({ v: c, label: c >= 1024 ? `${c / 1024}k` : String(c) })),
      });
      const totals = names.map((n) => [n, F.kv_bytes(d.specs[n], v.context, v.batch, bpv) / GB, w8 * F.weight_bytes(d.specs[n]) / GB]);
      const top = Math.max(...totals.map(([, kv, w]) => kv + w), ...Object.values(d.gpus).map((g) => g / GB));
      const bars = totals.map(([n, kv, w]) => {
        const fits = Object.entries(d.gpus).filter(([, cap]) => (kv + w) * GB <= cap).map(([label]) => label.split(" (")[0]);
        return `<tr><td>${W.esc(n)}</td><td class="ii-barcell"><span class="ii-bar" style="width:${(100 * w / top).toFixed(2)}%;background:#ccc"></span>` +
          `<span class="ii-bar" style="width:${(100 * kv / top).toFixed(2)}%;background:#ff7f0e"></span></td>` +
          `<td>${W.fmt(kv + w, 1)} GB</td><td>fits on ${fits.join(", ") || "none of these GPUs"}</td></tr>`;
      });
      return chart + `<p class="ii-caption">At ${W.fmt(v.context)} tokens × batch ${v.batch}: ${what} (${v.kind}` +
        `${v.include_weights ? "; weights in bf16, grey" : ""})</p><table class="ii-table ii-bars">${bars.join("")}</table>`;
    };

    R.speedup_curves = (v, d, width) => {
      const gs = [...Array(17).keys()];
      const best = F.best_gamma(v.alpha, v.c, 16);
      return W.chart({
        width, height: 300, title: `α = ${W.pyfloat(v.alpha)}, c = ${W.pyfloat(v.c)}`, xlabel: "γ (guesses per round)", ylabel: "tokens / speedup (×)",
        series: [
          { label: "tokens per target pass", color: COLORS[0], marker: "circle", x: gs, y: gs.map((g) => F.expected_tokens_per_pass(v.alpha, g)) },
          { label: "predicted speedup", color: COLORS[1], marker: "square", x: gs, y: gs.map((g) => F.expected_speedup(v.alpha, g, v.c)) },
        ],
        ymin: 0,
        vlines: [{ v: v.gamma, color: "#777", dash: "2 3", label: `γ = ${v.gamma}: ${W.fmt(F.expected_speedup(v.alpha, v.gamma, v.c), 2)}×` }],
        hlines: [{ v: 1, color: "#999" }],
        points: [{ x: best, y: F.expected_speedup(v.alpha, best, v.c), marker: "star", color: "#d62728", label: `best γ = ${best}` }],
      }) + `<p class="ii-result">γ = ${v.gamma}: ${W.fmt(F.expected_tokens_per_pass(v.alpha, v.gamma), 2)} tokens per target pass, ` +
        `predicted speedup ${W.fmt(F.expected_speedup(v.alpha, v.gamma, v.c), 2)}×; best γ = ${best} ` +
        `(${W.fmt(F.expected_speedup(v.alpha, best, v.c), 2)}×)</p>`;
    };
    return W;
  }
})();
