// The serving report's configuration space: the rows from their columns (serve_space.py), the chart drawn against
// the latency chosen in #serve-x and coloured by the axis chosen in #serve-colour, the region past a latency target
// shaded, the Pareto front of that latency joined by a line.
(function () {
  "use strict";
  const state = window.meshplan, data = state.data;
  if (!data.serve_space) return;
  const sp = data.serve_space, cols = sp.columns, vocab = cols.vocab;
  const FRONT = { tpot: 1, ttft: 2, e2e: 4 };
  const NUMBERS = ["tp", "pp", "dpa", "ep", "batch"];

  function count(x) {
    const units = [[1e9, "B"], [1e6, "M"], [1e3, "k"]];
    for (let i = 0; i < units.length; i++) {
      if (x >= units[i][0]) return (x / units[i][0]).toPrecision(3) + units[i][1];
    }
    return x.toPrecision(3);
  }

  function describe(r) {
    let s = "tp=" + r.tp;
    ["pp", "dpa", "ep"].forEach(function (k) { if (Number(r[k]) > 1) s += " " + k + "=" + r[k]; });
    return s + " " + r.pools + " batch=" + r.batch + " " + r.quant;
  }

  function texts(r) {
    r.rate = count(r.per_gpu);
    r.tpot_text = state.fmtTime(r.tpot);
    r.ttft_text = state.fmtTime(r.ttft);
    r.e2e_text = state.fmtTime(r.e2e);
    return r;
  }

  const points = [], rejected = [];
  for (let i = 0; i < cols.tp.length; i++) {
    const r = { replicas: cols.replicas[i], prefill: cols.prefill_replicas[i], quant: vocab.quant[cols.quant[i]],
                ttft: cols.ttft[i], tpot: cols.tpot[i], e2e: cols.e2e[i], per_gpu: cols.per_gpu[i],
                memory: cols.memory[i], front: cols.front[i], verdict: vocab.verdict[cols.verdict[i]] };
    NUMBERS.forEach(function (k) { r[k] = String(cols[k][i]); });
    r.pools = r.prefill ? r.prefill + "P+" + r.replicas + "D" : "x" + r.replicas;
    r.plan = describe(r);
    (r.verdict === "fits" ? points : rejected).push(texts(r));
  }
  const best = sp.best.map(function (b) { return texts(Object.assign({}, b)); });
  state.serve = { x: "tpot", axis: "tp", points: points, rejected: rejected, best: best };

  function scheme(n) { return n <= 10 ? "tableau10" : (n <= 20 ? "category20" : "viridis"); }

  function fill(template) {
    const spec = JSON.parse(JSON.stringify(template)), key = state.serve.x, axis = state.serve.axis;
    const title = sp.x_axes[key][0], unit = sp.x_axes[key][1], factor = sp.x_axes[key][2];
    let lo = Infinity, hi = 0, ylo = Infinity, yhi = 0;
    [points, rejected, best].forEach(function (set) {
      set.forEach(function (r) {
        r.x = r[key] * factor;
        r.onFront = (r.front & FRONT[key]) > 0;
        lo = Math.min(lo, r.x);
        hi = Math.max(hi, r.x);
        if (r.per_gpu > 0) { ylo = Math.min(ylo, r.per_gpu); yhi = Math.max(yhi, r.per_gpu); }
      });
    });
    const slo = [], target = sp.slo[key] || 0;
    if (target > 0) {
      hi = Math.max(hi, target * factor * 1.5);
      slo.push({ x: target * factor, x2: hi * 1.25,
                 text: key.toUpperCase() + " above its target of " + state.fmtTime(target) });
    }
    const x = { field: "x", type: "quantitative", title: title + " (" + unit + ", log scale)",
                scale: { type: "log", domain: [lo / 1.25, hi * 1.25], clamp: true } };
    const domain = vocab[axis].slice();
    spec.datasets = { points: points, rejected: rejected, best: best, slo: slo };
    // the y domain from every set at once: a set left empty (no rejected configuration) has no extent of its own,
    // which Vega warns about ("Infinite extent")
    const yscale = yhi > 0 ? { type: "log", domain: [ylo / 1.25, yhi * 1.25] } : { type: "log" };
    spec.layer.forEach(function (layer) {
      if (layer.encoding && layer.encoding.x) layer.encoding.x = x;
      if (layer.encoding && layer.encoding.y) layer.encoding.y = Object.assign({}, layer.encoding.y, { scale: yscale });
      if (layer.name === "points") {
        layer.encoding.color = { field: axis, type: "ordinal", title: sp.axes[axis],
                                 scale: { domain: domain, scheme: scheme(domain.length) },
                                 legend: { columns: Math.min(domain.length, 6) } };
      }
    });
    return spec;
  }
  state.prepare["serve-space"] = fill;

  state.hooks.push(function () {
    state.serve.drawn = state.serve.x + "/" + state.serve.axis;
    ["serve-x", "serve-colour"].forEach(function (id) {
      const select = document.getElementById(id);
      select.addEventListener("change", function () {
        state.serve[id === "serve-x" ? "x" : "axis"] = select.value;
        const want = state.serve.x + "/" + state.serve.axis;
        state.draw("serve-space", fill(data.charts["serve-space"])).then(function () { state.serve.drawn = want; });
      });
    });
  });
})();
