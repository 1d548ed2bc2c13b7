"""The error bands every estimate quotes (src/meshplan/specs/bands.py): from the out-of-source errors of
docs/out_of_source.json (benchmarks/docs/out_of_source.py), per quantity a table of bands by regime (specs/regime.py),
each the conformal quantile of its runs' |errors| at the table's nominal coverage, with the runs and sources it rests
on. Writes src/meshplan/presets/error_bands.json; tests/test_docs.py notices when it is stale, tests/test_bands.py
checks that each band covers its nominal share of the out-of-source errors of every regime with 20 or more runs and is
sharp (its median at most 2.5 times the regime's median |error|).

The levels go from the plan's whole regime to every run, dropping first what the errors depend on least: the scale
(one NVLink domain or more), the model's size, the stack within its family, then the family, then the GPU, then the
model kind; the work per kernel last, since small work is where meshplan reads worst. Serving drops the model's size
first, then its kind, the GPU, the engine; its batch last. A band rests on at least ``MIN_RUNS`` runs (peak memory:
``MIN_MEMORY_RUNS``, since three sources measured it: torchtitan's 18 runs and KempnerForge's 11 on Hopper,
BigScience's 30 BLOOM runs on Ampere; a memory regime is GPU, framework family and model kind, and its errors are the
runs' in-sample ones, which no fitted constant moves).

Run: python benchmarks/docs/error_bands.py [--out DIR] [--from FILE]   (reads docs/out_of_source.json; a second)
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from meshplan.specs.bands import SERVING_CLASSES, key_of
from meshplan.specs.regime import SERVING_AXES, TRAINING_AXES

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "docs" / "out_of_source.json"
OUT = ROOT / "src" / "meshplan" / "presets" / "error_bands.json"
COVERAGE = 0.8  # every band's nominal share of the runs it comes from
MIN_RUNS = 20
MIN_MEMORY_RUNS = 8
TRAINING_LEVELS = (TRAINING_AXES, ("gpu", "stack", "family", "kind", "size", "work"),
                   ("gpu", "stack", "family", "kind", "work"), ("gpu", "family", "kind", "work"),
                   ("gpu", "kind", "work"), ("family", "kind", "work"), ("kind", "work"), ("work",), ())
MEMORY_LEVELS = (("gpu", "family", "kind"), ("family", "kind"), ("family",), ())
SERVING_LEVELS = (SERVING_AXES, ("gpu", "engine", "kind", "size", "gpus", "work", "batch"),
                  ("gpu", "engine", "kind", "gpus", "work", "batch"), ("gpu", "engine", "kind", "work", "batch"),
                  ("gpu", "engine", "work", "batch"), ("engine", "work", "batch"), ("gpu", "work", "batch"),
                  ("work", "batch"), ("batch",), ())
# the axes whose value, unmeasured, makes a plan unlike every measured run (specs/bands.py's note): the stack's own
# name only refines its family's band
TRAINING_TRUST = ("gpu", "family", "kind", "work")
SERVING_TRUST = ("gpu", "engine", "kind", "work", "batch")


def conformal(errors: list[float], q: float = COVERAGE) -> float:
    """The smallest |e| that at least ⌈(n + 1)·q⌉ of the n errors do not exceed (the largest where that is more
    than n): a band that covers a new run of the same regime with probability at least q (specs/bands.py)."""
    e = sorted(abs(x) for x in errors)
    k = min(math.ceil((len(e) + 1) * q), len(e)) - 1
    return math.ceil(e[k] * 1e4 - 1e-9) / 1e4  # rounded up to 0.01 %: the k-th error stays inside


def table(rows: list[dict[str, Any]], trust: tuple[str, ...], levels: tuple[tuple[str, ...], ...], what: str,
          error: str = "oos_error", least: int = MIN_RUNS) -> dict[str, Any]:
    """One table of bands (module docstring) from ``rows`` (each with its regime and ``error``)."""
    entries: dict[str, Any] = {}
    for level in levels:
        by: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in rows:
            by[key_of(r["regime"], level)].append(r)
        for key, runs in by.items():
            errors = sorted(abs(r[error]) for r in runs)
            entries[key] = {"band": conformal(errors), "runs": len(runs), "sources": len({r["source"] for r in runs}),
                            "median": round(errors[len(errors) // 2], 4),
                            "p90": round(errors[min(math.ceil(0.9 * len(errors)), len(errors)) - 1], 4)}
    seen = {a: dict(sorted(_count(rows, a).items())) for a in trust}
    return {"what": what, "coverage": COVERAGE, "min_runs": least, "axes": list(levels[0]), "trust": list(trust),
            "levels": [list(lv) for lv in levels], "seen": seen, "entries": dict(sorted(entries.items()))}


def _count(rows: list[dict[str, Any]], axis: str) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for r in rows:
        out[r["regime"][axis]] += 1
    return out


def spec_of(name: str) -> tuple[Any, ...]:
    """The arguments of ``table`` after its rows for the table ``name``."""
    if name == "training":
        return TRAINING_TRUST, TRAINING_LEVELS, "step time"
    if name == "memory":
        return MEMORY_LEVELS[0], MEMORY_LEVELS, "peak memory", "memory_error", MIN_MEMORY_RUNS
    return SERVING_TRUST, SERVING_LEVELS, name.split("/")[1]


def tables(data: dict[str, Any]) -> dict[str, Any]:
    """Every table of the bands file from out_of_source.json's runs."""
    runs = [r for r in data["runs"] if r.get("oos_error") is not None and r.get("regime")]
    training = [r for r in runs if r["kind"] == "training"]
    memory = [r for r in training if r.get("memory_error") is not None]
    out = {"training": table(training, *spec_of("training")), "memory": table(memory, *spec_of("memory"))}
    # a MoE layout the source does not state, priced at the engine's default: evaluated, kept out of the bands
    serving = [r for r in runs if r["kind"] == "serving" and r.get("layout_stated", True)]
    for name, metrics in SERVING_CLASSES.items():
        chosen = [r for r in serving if r["metric"] in metrics and (name != "throughput" or r.get("headline"))]
        out[f"serving/{name}"] = table(chosen, *spec_of(f"serving/{name}"))
    return out


def main() -> None:
    out = OUT
    if "--out" in sys.argv:
        out = Path(sys.argv[sys.argv.index("--out") + 1]) / OUT.name
    source = Path(sys.argv[sys.argv.index("--from") + 1]) if "--from" in sys.argv else SOURCE
    data = json.loads(source.read_text())
    about = " ".join(__doc__.split("\n\n")[0].split())
    out.write_text(json.dumps({"about": about, "tables": tables(data)}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
