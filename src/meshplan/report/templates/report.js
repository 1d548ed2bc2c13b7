// The report's script: draws every chart of the page with vega-embed from the specs in #meshplan-data, and says
// when all are drawn (window.meshplan.ready) so that tests and screenshots can wait for it.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("meshplan-data").textContent);
  const state = { data: data, views: {}, ready: false, failed: [] };
  window.meshplan = state;

  function draw(key, spec) {
    const target = document.querySelector('[data-chart="' + key + '"]');
    if (!target) return Promise.resolve(null);
    const renderer = (data.renderers || {})[key] || "svg";
    return vegaEmbed(target, spec, { actions: false, renderer: renderer }).then(function (result) {
      state.views[key] = result.view;
      return result.view;
    }).catch(function (error) {
      state.failed.push(key);
      console.error("chart " + key + ": " + error);
    });
  }
  state.draw = draw;

  const pending = Object.keys(data.charts).map(function (key) { return draw(key, data.charts[key]); });
  state.hooks = [];
  Promise.all(pending).then(function () {
    return Promise.all(state.hooks.map(function (hook) { return hook(state); }));
  }).then(function () { state.ready = true; });
})();
