"""Time what the serving report adds to a serving search (meshplan serve ... --report): the search keeping every
configuration it priced (``keep=True``) against the plain search, the page's rendering, and the page's size.

The cases are benchmarks/measure/serve_speed.py's. Each time is the best of three, one process (the Vega runtime's
bundle is made once, before the first case).

Run: python benchmarks/measure/serve_report_speed.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from meshplan.report.serve_html import render_serving  # noqa: E402
from meshplan.report.vega import bundle  # noqa: E402
from meshplan.serve.engine import load_engine  # noqa: E402
from meshplan.serve.search import search  # noqa: E402
from meshplan.serve.space import ServeSpace  # noqa: E402
from meshplan.specs.hardware import load_system  # noqa: E402
from meshplan.specs.model_load import load_model  # noqa: E402
from serve_speed import CASES  # noqa: E402


def best_of(runs: int, call, *args, **kwargs):
    """The least seconds of ``runs`` calls, and what the last returned."""
    times, out = [], None
    for _ in range(runs):
        start = time.perf_counter()
        out = call(*args, **kwargs)
        times.append(time.perf_counter() - start)
    return min(times), out


def main() -> None:
    bundle()
    print(f"{'model':<16}{'GPUs':>6}{'configurations':>16}{'search s':>10}{'keep s':>9}{'render s':>10}"
          f"{'drawn':>8}{'page bytes':>12}")
    for name, system, gpus, inp, out, ttft, tpot in CASES:
        model, cluster = load_model(name), load_system(system).cluster(gpus)
        space = ServeSpace(input_len=inp, output_len=out, ttft_slo=ttft, tpot_slo=tpot, engine=load_engine("vllm"))
        plain, _ = best_of(3, search, model, cluster, space, top_k=10)
        kept, result = best_of(3, search, model, cluster, space, top_k=10, keep=True)
        took, page = best_of(3, render_serving, result)
        data = json.loads(page.split('id="meshplan-data">')[1].split("</script>")[0])
        drawn = len(data["serve_space"]["columns"]["tp"]) if "serve_space" in data else 0
        print(f"{name:<16}{gpus:>6}{result.evaluated:>16,}{plain:>10.3f}{kept:>9.3f}{took:>10.3f}{drawn:>8,}"
              f"{len(page.encode()):>12,}")


if __name__ == "__main__":
    main()
