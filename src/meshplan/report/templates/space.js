// The plan space: the sample's rows from their columns, the chart coloured by the axis chosen in #colour-axis, the
// held plans clickable (state.pick, from compare.js), the picked ones marked A and B.
(function () {
  "use strict";
  const state = window.meshplan, data = state.data;
  if (!data.space) return;
  const space = data.space, cols = space.columns, vocab = cols.vocab;
  const CATEGORIES = Object.keys(vocab);
  const points = [], rejected = [];
  for (let i = 0; i < cols.time.length; i++) {
    const r = { time: cols.time[i], memory: cols.memory[i], dp: cols.dp[i], pp: cols.pp[i], cp: cols.cp[i],
                ep: cols.ep[i], vpp: cols.vpp[i], mbs: cols.micro_batch[i], sp: cols.sp[i] ? "sp" : "" };
    CATEGORIES.forEach(function (k) { r[k] = vocab[k][cols[k][i]]; });
    r.plan = "dp=" + r.dp + " tp=" + r.tp + " pp=" + r.pp + (r.cp > 1 ? " cp=" + r.cp : "") +
      (r.ep > 1 ? " ep=" + r.ep : "") + (r.vpp > 1 ? " vpp=" + r.vpp : "") + " mbs=" + r.mbs + " zero=" + r.zero +
      " recompute=" + r.recompute + (r.sp ? " sp" : "") + (r.offload !== "none" ? " offload=" + r.offload : "") +
      (r.schedule !== "-" ? " " + r.schedule : "") + " placement=" + r.placement;
    r.step = state.fmtTime(r.time);
    (r.status === "fits" ? points : rejected).push(r);
  }
  const plans = (data.plans || []).filter(function (p) { return p.gpus === space.gpus; }).map(function (p) {
    const f = p.fields;
    return { id: p.id, time: p.time, memory: p.memory, origin: p.origin, plan: p.describe, step: p.step,
             status: p.fits ? "fits" : p.reasons.join("; "), framework: f.framework, front3d: p.front,
             on2d: p.origin.indexOf("front") >= 0, hint: "click to compare",
             kind: p.origin === "your config" ? "your config" : (p.origin.charAt(0) === "#" ? "best plan" : "Pareto front"),
             tp: String(f.tp), pp: String(f.pp), cp: String(f.cp), ep: String(f.ep), zero: String(f.ZeRO),
             recompute: f.recompute, offload: f.offload };
  });
  const others = space.others.map(function (o) {
    return { time: o.time, memory: o.memory, gpus: o.gpus, plan: o.plan, step: state.fmtTime(o.time),
             front3d: o.front3d };
  });
  state.space = { axis: "tp", points: points, rejected: rejected, plans: plans };

  function picked() {
    const out = [];
    (state.picked || []).forEach(function (id, slot) {
      const p = plans.find(function (q) { return q.id === id; });
      if (p) out.push({ time: p.time, memory: p.memory, slot: slot ? "B" : "A" });
    });
    return out;
  }

  function fill(template) {
    const spec = JSON.parse(JSON.stringify(template)), axis = state.space.axis;
    const domain = vocab[axis] ? vocab[axis].slice() : [];
    plans.forEach(function (p) { if (domain.indexOf(p[axis]) < 0) domain.push(p[axis]); });
    spec.datasets = { points: points, rejected: rejected, plans: plans, others: others, regions: space.regions,
                      picked: picked() };
    spec.layer.forEach(function (layer) {
      if (layer.name === "sample" || layer.name === "plans") {
        layer.encoding.color = { field: axis, type: "nominal", title: space.axes[axis],
                                 scale: { domain: domain, scheme: domain.length > 10 ? "category20" : "tableau10" } };
      }
    });
    return spec;
  }
  state.prepare.space = fill;

  function listen(view) {
    if (!view) return;
    view.addEventListener("click", function (event, item) {
      if (item && item.datum && item.datum.id !== undefined && state.pick) state.pick(item.datum.id);
    });
  }
  state.showPicked = function () {
    const view = state.views.space;
    return view ? view.data("picked", picked()).runAsync() : Promise.resolve();
  };
  state.hooks.push(function () {
    listen(state.views.space);
    state.space.drawn = state.space.axis;
    const select = document.getElementById("colour-axis");
    select.addEventListener("change", function () {
      state.space.axis = select.value;
      state.draw("space", fill(data.charts.space)).then(function (view) {
        listen(view);
        state.space.drawn = select.value;
      });
    });
  });
})();
