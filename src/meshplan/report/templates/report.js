// The report's script: draws every chart of the page with vega-embed from the specs in #meshplan-data, and says
// when all are drawn (window.meshplan.ready) so that tests and screenshots can wait for it. The sections' scripts
// (space.js, compare.js) run before the first drawing and may register how a chart's spec is filled in
// (state.prepare[key]) and what to do once every chart is drawn (state.hooks).
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("meshplan-data").textContent);
  const state = { data: data, views: {}, ready: false, failed: [], prepare: {}, hooks: [] };
  window.meshplan = state;

  state.draw = function (key, spec) {
    const target = document.querySelector('[data-chart="' + key + '"]');
    if (!target) return Promise.resolve(null);
    const renderer = (data.renderers || {})[key] || "svg";
    if (state.views[key]) state.views[key].finalize();
    return vegaEmbed(target, spec, { actions: false, renderer: renderer }).then(function (result) {
      state.views[key] = result.view;
      return result.view;
    }).catch(function (error) {
      state.failed.push(key);
      console.error("chart " + key + ": " + error);
    });
  };

  state.fmtTime = function (s) {
    if (s >= 1) return s.toPrecision(3) + " s";
    if (s >= 1e-3) return (s * 1e3).toPrecision(3) + " ms";
    return (s * 1e6).toPrecision(3) + " µs";
  };

  Promise.resolve().then(function () {  // after every section's script has registered itself
    const pending = Object.keys(data.charts).map(function (key) {
      const spec = state.prepare[key] ? state.prepare[key](data.charts[key]) : data.charts[key];
      return state.draw(key, spec);
    });
    return Promise.all(pending);
  }).then(function () {
    return Promise.all(state.hooks.map(function (hook) { return hook(state); }));
  }).then(function () { state.ready = true; });
})();
