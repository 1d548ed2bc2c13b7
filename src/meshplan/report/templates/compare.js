// Compare two held plans (A and B, from the menus or clicks in the plan space): cards, both breakdowns, both memory
// footprints, both pipeline timelines, the difference per component explained by the plan fields it depends on,
// and the trust panel of plan A.
(function () {
  "use strict";
  const state = window.meshplan, data = state.data;
  if (!data.compare) return;
  const cmp = data.compare, byId = {};
  data.plans.forEach(function (p) { byId[p.id] = p; });
  state.picked = cmp.pair.slice();
  state.nextSlot = 0;
  const KIND = ["forward", "backward", "idle (bubble)", "busy (blocks merged)"];

  function pair() { return [byId[state.picked[0]], byId[state.picked[1]]]; }

  function unitOf(seconds) { return seconds >= 1 ? ["s", 1] : ["ms", 1e3]; }

  function breakdown(template) {
    const spec = JSON.parse(JSON.stringify(template)), ab = pair();
    const top = Math.max(ab[0].time, ab[1].time), unit = unitOf(top);
    const rows = [];
    cmp.components.forEach(function (c) {
      ab.forEach(function (p, i) {
        const v = p.breakdown[c];
        if (ab[0].breakdown[c] > 0 || ab[1].breakdown[c] > 0) {
          rows.push({ component: c, plan: i ? "B" : "A", value: v * unit[1], time: state.fmtTime(v) });
        }
      });
    });
    spec.data = { values: rows };
    spec.height = 13 * rows.length + 10;
    spec.encoding.y.sort = cmp.components;
    spec.encoding.x.title = "exposed time per step (" + unit[0] + ")";
    return spec;
  }

  function memory(template) {
    const spec = JSON.parse(JSON.stringify(template)), ab = pair(), rows = [];
    Object.keys(ab[0].parts).forEach(function (k) {
      ab.forEach(function (p, i) {
        rows.push({ part: k, plan: i ? "B" : "A", value: p.parts[k], gib: p.parts[k].toFixed(2) });
      });
    });
    spec.data = { values: rows };
    spec.title = ["Memory per GPU by part", "A " + ab[0].peak + ", B " + ab[1].peak + "; HBM " +
      ab[0].hbm.toFixed(1) + " GiB"];
    return spec;
  }

  function timeline(slot) {
    return function (template) {
      const spec = JSON.parse(JSON.stringify(template)), p = pair()[slot], t = state.timeline(p);  // timeline.js
      spec.data = { values: t.rows.map(function (r) {
        const kind = KIND[r[3]];
        return { rank: r[0], start: r[1], end: r[2], kind: kind, label: r[4],
                 what: kind + (r[4] ? " " + r[4] : "") + ": " + r[1] + "–" + r[2] + " " + t.unit };
      }) };
      spec.height = Math.max(40, 22 * t.pp);
      spec.title = ["Pipeline timeline of " + (slot ? "B" : "A"), t.schedule + ", pp=" + t.pp +
        (t.vpp > 1 ? ", vpp=" + t.vpp : "") + ", " + t.micro_batches + " micro-batches, bubble " +
        (100 * t.bubble).toFixed(1) + "%" + (t.merged ? " (blocks merged)" : "")];
      spec.layer[0].encoding.x.title = "time within the step (" + t.unit + ")";
      return spec;
    };
  }
  state.prepare["compare-breakdown"] = breakdown;
  state.prepare["compare-memory"] = memory;
  state.prepare["compare-timeline-a"] = timeline(0);
  state.prepare["compare-timeline-b"] = timeline(1);

  function cell(row, text, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    row.appendChild(td);
  }

  function what(drivers, a, b) {  // the driver's text, with what only plan A's or B's settings bring
    const x = drivers.extra;
    const has = function (p) { return x && String(p.fields[x.field]).indexOf(x.value) >= 0; };
    return drivers.what + (has(a) || has(b) ? x.text : "");
  }

  function why(drivers, a, b) {
    const changed = drivers.fields.filter(function (f) { return String(a.fields[f]) !== String(b.fields[f]); })
      .map(function (f) { return f + " " + a.fields[f] + " → " + b.fields[f]; });
    return what(drivers, a, b) + (changed.length ? ". A → B: " + changed.join(", ") : ". Same settings in A and B: " +
      "the difference comes through the other components (or the busiest rank changed)");
  }

  function bubbleForm(p) {
    const f = p.fields, m = f["micro-batches"];
    if (f.pp <= 1) return "pp = 1: no bubble";
    return "(" + f.pp + " − 1)/(" + f.vpp + "·" + m + ") = " + (100 * (f.pp - 1) / (f.vpp * m)).toFixed(1) + "%";
  }

  function table() {
    const ab = pair(), body = document.querySelector("#compare-why tbody");
    body.textContent = "";
    cmp.components.forEach(function (c) {
      const a = ab[0].breakdown[c], b = ab[1].breakdown[c];
      if (!(a > 0 || b > 0)) return;
      const row = document.createElement("tr"), d = b - a;
      const same = what(cmp.drivers[c], ab[0], ab[1]) + ": equal in A and B";
      let text = Math.abs(d) > 1e-9 * Math.max(a, b) ? why(cmp.drivers[c], ab[0], ab[1]) : same;
      if (c === "bubble") text += "; A " + bubbleForm(ab[0]) + ", B " + bubbleForm(ab[1]);
      cell(row, c, "l"); cell(row, state.fmtTime(a)); cell(row, state.fmtTime(b));
      cell(row, text === same ? "0" : (d >= 0 ? "+" : "−") +
        state.fmtTime(Math.abs(d)), d > 0 ? "plus" : (d < 0 ? "minus" : ""));
      cell(row, text, "l w why");
      body.appendChild(row);
    });
    Object.keys(ab[0].parts).forEach(function (k) {
      const a = ab[0].parts[k], b = ab[1].parts[k], row = document.createElement("tr"), d = b - a;
      cell(row, "memory: " + k, "l"); cell(row, a.toFixed(2) + " GiB"); cell(row, b.toFixed(2) + " GiB");
      cell(row, Math.abs(d) < 5e-3 ? "0" : (d >= 0 ? "+" : "−") + Math.abs(d).toFixed(2) + " GiB",
        d >= 5e-3 ? "plus" : (d <= -5e-3 ? "minus" : ""));
      cell(row, Math.abs(d) > 1e-6 ? why(cmp.memory_drivers[k], ab[0], ab[1]) : cmp.memory_drivers[k].what +
        ": equal in A and B", "l w why");
      body.appendChild(row);
    });
  }

  function cards() {
    const ab = pair(), box = document.getElementById("compare-cards");
    box.textContent = "";
    const d = ab[1].time / ab[0].time - 1;
    [["A", ab[0]], ["B", ab[1]]].forEach(function (x) {
      const div = document.createElement("div"), k = document.createElement("div"), v = document.createElement("div");
      div.className = "card"; k.className = "k"; v.className = "v";
      k.textContent = x[0] + ": " + x[1].label;
      v.textContent = x[1].step + " · " + x[1].peak + " · MFU " + (100 * x[1].mfu).toFixed(1) + "%";
      div.appendChild(k); div.appendChild(v); box.appendChild(div);
    });
    const div = document.createElement("div");
    div.className = "card";
    div.innerHTML = '<div class="k">B against A</div><div class="v"></div>';
    div.querySelector(".v").textContent = (d >= 0 ? "+" : "−") + Math.abs(100 * d).toFixed(1) + "% step time";
    box.appendChild(div);
  }

  function trust() {
    document.querySelectorAll(".trust").forEach(function (el) {
      el.classList.toggle("hidden", Number(el.dataset.plan) !== state.picked[0]);
    });
  }

  state.update = function () {
    document.getElementById("pick-a").value = String(state.picked[0]);
    document.getElementById("pick-b").value = String(state.picked[1]);
    cards(); table(); trust();
    const keys = ["compare-breakdown", "compare-memory", "compare-timeline-a", "compare-timeline-b"];
    state.compared = null;
    return Promise.all(keys.map(function (key) {
      return state.draw(key, state.prepare[key](data.charts[key]));
    })).then(function () {
      state.compared = state.picked.slice();
      return state.showPicked ? state.showPicked() : null;
    });
  };

  state.pick = function (id) {
    state.picked[state.nextSlot] = id;
    state.nextSlot = 1 - state.nextSlot;
    return state.update();
  };

  state.hooks.push(function () {
    cards(); table(); trust();
    state.compared = state.picked.slice();
    ["pick-a", "pick-b"].forEach(function (name, slot) {
      document.getElementById(name).addEventListener("change", function (event) {
        state.picked[slot] = Number(event.target.value);
        state.update();
      });
    });
  });
})();
