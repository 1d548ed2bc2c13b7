"""What the browser tests of the two HTML reports share (tests/test_report_browser.py, test_serve_report_browser.py;
the headless Chromium fixture is conftest.py's): the page's ready flag, the per-chart layout probe, moving the mouse
onto a value of a chart as a user does, and the tooltip it shows."""

from __future__ import annotations

READY = "window.meshplan && window.meshplan.ready"
# every chart of the page: its drawn size, how many scenegraph items Vega laid out, and where its legends end (the
# right edge of each legend group in the chart's pixels: a legend wider than the chart is cut off, not scrolled)
CHARTS_JS = """
Array.from(document.querySelectorAll('[data-chart]')).map(el => {
  const key = el.dataset.chart, view = window.meshplan.views[key];
  const drawn = el.querySelector('svg, canvas'), box = drawn ? drawn.getBoundingClientRect() : {width: 0, height: 0};
  const count = node => (node.items || []).reduce((n, item) => n + 1 + count(item), 0);
  const legends = [];
  const walk = (mark, x) => (mark.items || []).forEach(item => {
    if (mark.role === 'legend') legends.push(view.origin()[0] + x + item.bounds.x2);
    else if (item.items) item.items.forEach(m => walk(m, x + (item.x || 0)));
  });
  if (view) walk(view.scenegraph().root, 0);
  return {key, width: box.width, height: box.height, right: box.right, items: view ? count(view.scenegraph().root) : 0,
          legendRight: Math.max(0, ...legends), legends: legends.length};
})
"""


def pixel(page, key: str, x: float, y: float) -> tuple[float, float]:
    """Where a value pair is drawn in a chart, in page pixels (from the chart's own scales)."""
    return tuple(page.evaluate("""([key, x, y]) => {
      const v = window.meshplan.views[key], r = v.container().querySelector('svg, canvas').getBoundingClientRect();
      const o = v.origin(), pad = v.padding();
      return [r.left + pad.left + o[0] + v.scale('x')(x), r.top + pad.top + o[1] + v.scale('y')(y)];
    }""", [key, x, y]))


def hover(page, key: str, x: float, y: float) -> tuple[float, float]:
    """Move the mouse onto a mark as a user does: near it first (the first pointer event over a canvas only enters
    it), then onto it; where it went, in page pixels."""
    px, py = pixel(page, key, x, y)
    page.mouse.move(px - 3, py - 3)
    page.mouse.move(px, py)
    return px, py


def tooltip_text(page) -> str:
    """The text of Vega's tooltip, once it shows."""
    tooltip = page.locator("#vg-tooltip-element")
    tooltip.wait_for(state="visible")
    return tooltip.inner_text()
