// The merged pipeline timelines the report leaves to the page (report/detail.py replay_inputs): a plan's timeline is
// simulated when the comparison first shows it, in the same floating-point operations, in the same order, as
// tables.build, replay.replay_table, simulator.simulate (pipeline/), split_runs.PipelineRun.idle and
// detail.compact_timeline(merged=True), so that its rows are the numbers Python would have written
// (tests/test_report_timeline_js.py checks them against Python's, plan by plan).
(function () {
  "use strict";
  const state = window.meshplan;

  function order(m, vpp, n) {  // tables._interleaved_order: [micro, chunk] of each virtual micro-batch
    const out = [];
    for (let first = 0; first < m; first += n) {
      const last = first + n >= m ? m : first + n;
      for (let c = 0; c < vpp; c++) for (let j = first; j < last; j++) out.push([j, c]);
      if (last === m) break;
    }
    return out;
  }

  // tables.build: each rank's [backward (0 or 1), micro, chunk] in order, from the table's group size n and each
  // rank's warm-up, its schedule's record's (replay_inputs: tables.warm_ups)
  function build(pp, m, vpp, n, warmup) {
    const seq = order(m, vpp, n), total = seq.length, table = [];
    for (let r = 0; r < pp; r++) {
      const w = warmup[r], row = [];
      const fwd = function (k) { return [0, seq[k][0], seq[k][1]]; };
      const bwd = function (k) { return [1, seq[k][0], vpp - 1 - seq[k][1]]; };
      for (let k = 0; k < w; k++) row.push(fwd(k));
      for (let k = 0; k < total - w; k++) row.push(fwd(w + k), bwd(k));
      for (let k = total - w; k < total; k++) row.push(bwd(k));
      table.push(row);
    }
    return table;
  }

  function replay(table, tf, tb, pp, m, vpp) {  // replay.replay_table, no p2p time (plots.pipeline_run)
    const stages = pp * vpp, n = stages * m, done = new Float64Array(2 * n).fill(NaN);
    const wait = new Int32Array(2 * n).fill(-1), next = new Array(pp).fill(0), free = new Array(pp).fill(0);
    const starts = table.map(function (row) { return new Float64Array(row.length); });
    const ends = table.map(function (row) { return new Float64Array(row.length); });
    const ready = [];
    for (let r = 0; r < pp; r++) ready.push(r);
    while (ready.length) {
      const r = ready.pop(), row = table[r];
      let i = next[r], t = free[r];
      for (; i < row.length; i++) {
        const b = row[i][0], j = row[i][1], s = row[i][2] * pp + r, own = s * m + j + n * b;
        const dep = b ? (s === stages - 1 ? s * m + j : (s + 1) * m + j + n) : (s === 0 ? -1 : (s - 1) * m + j);
        let start = t;
        if (dep >= 0) {
          const finish = done[dep];
          if (Number.isNaN(finish)) { wait[dep] = r; break; }
          const at = finish + 0.0;  // replay_table's finish + hops[-1], the 0.0 of "no hop"
          start = t >= at ? t : at;
        }
        t = done[own] = start + (b ? tb[s] : tf[s]);
        starts[r][i] = start; ends[r][i] = t;
        if (wait[own] >= 0 && wait[own] !== r) ready.push(wait[own]);
      }
      next[r] = i; free[r] = t;
    }
    return { free: free, starts: starts, ends: ends };
  }

  function g4(x) {  // detail._g, float(f"{x:.4g}"): toPrecision rounds a tie away from zero, Python to even
    const exact = x.toExponential(99), digits = exact[0] + exact.slice(2, 101);
    if (digits[4] === "5" && /^0*$/.test(digits.slice(5)) && Number(digits[3]) % 2 === 0) {
      return Number(digits[0] + "." + digits.slice(1, 4) + exact.slice(101));
    }
    return Number(x.toPrecision(4));
  }

  function gaps(starts, ends, step) {  // split_runs.PipelineRun.idle of one rank: (start, length) of each idle interval
    const out = [], tiny = 1e-12 * Math.max(1.0, step);
    let t = 0.0;
    for (let i = 0; i < starts.length; i++) {
      if (starts[i] - t > tiny) out.push([t, starts[i] - t]);
      if (ends[i] > t) t = ends[i];
    }
    if (step - t > tiny) out.push([t, step - t]);
    return out;
  }

  function fill(t) {  // simulator.simulate, then detail.compact_timeline(run, merged=True)
    const pp = t.pp, vpp = t.vpp, m = t.micro_batches, tf = [], tb = [];
    for (let s = 0; s < pp * vpp; s++) { tf.push(t.replay.t_fwd[s % pp]); tb.push(t.replay.t_bwd[s % pp]); }
    const table = build(pp, m, vpp, t.replay.group, t.replay.warmup), run = replay(table, tf, tb, pp, m, vpp);
    const step = Math.max.apply(null, run.free);
    const busy = table.map(function (row, r) {
      let sum = 0;
      row.forEach(function (a) { sum += a[0] ? tb[a[2] * pp + r] : tf[a[2] * pp + r]; });
      return sum;
    });
    const unit = step >= 1.0 ? ["s", 1.0] : ["ms", 1e3], scale = unit[1], rows = [];
    table.forEach(function (row, r) {
      const shown = gaps(run.starts[r], run.ends[r], step).filter(function (g) { return g[1] >= step / t.replay.pixels; });
      let at = 0.0;
      shown.concat([[step, 0.0]]).forEach(function (g) {
        if (g[0] > at) rows.push([r, g4(at * scale), g4(g[0] * scale), 3, ""]);
        at = g[0] + g[1];
      });
      shown.forEach(function (g) { rows.push([r, g4(g[0] * scale), g4((g[0] + g[1]) * scale), 2, ""]); });
    });
    t.unit = unit[0];
    t.step = g4(step * scale);
    t.rows = rows;
    t.bubble = step ? (step - Math.max.apply(null, busy)) / step : 0.0;
  }

  state.timeline = function (plan) {  // the plan's timeline, simulated here the first time it is asked for
    const t = plan.timeline;
    if (t.replay && !t.rows) fill(t);
    return t;
  };
})();
