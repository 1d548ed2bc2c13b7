"""How far a prediction may be from the measured value: the band of out-of-source errors of the measured runs of its
regime (issue 79; specs/regime.py says what a regime is).

``presets/error_bands_core.json`` (written by benchmarks/docs/error_bands.py from docs/out_of_source.json beside the
full ``error_bands.json``: the fields read here, the entries with a table's least runs) holds one table
per quantity: training step time, peak memory, and serving throughput, time to first token, time per output token and
end-to-end latency. A table has its axes, its levels (from the most specific regime to every run), its nominal
coverage and, per regime of each level with runs, the ``conformal`` band (the conformal quantile of the |errors| of
the regime's runs, each priced with every fitted constant refitted without its source: the smallest |e| that at least
⌈(n + 1)·q⌉ of the n runs do not exceed; Vovk et al. 2005, "Algorithmic Learning in a Random World", §2.3), which
covers a new run of the sources that measured the regime, and the ``band`` quoted, widened for a source not yet
measured (``new_source["seen"]`` times the conformal band, at most 2.5 times the runs' median |error|: the script's
docstring says how, after Dunn, Wasserman & Ramdas 2023 and Barber et al. 2021), the runs it rests on, how many sources
they come from and ``held``, the share of its runs inside the band quoted them when every table was built without
their source. A plan takes the band of the most specific level whose regime holds at least ``min_runs`` runs. Where
that share is below the nominal coverage, the band says so in one line (``Band.note``). Where the plan's own value of
an axis has fewer than ``min_runs`` measured runs in the whole table (an AMD engine, a GPU with a new host, an engine
version nobody measured), no measured run is like it: the band widens to the widest band of the regimes that differ
from it only there, times ``new_source["unseen"]`` (how far a source's runs fell beyond the band its neighbouring
regimes quoted when it was new), and says so in one line.

Two plans whose step times differ by less than the ranking band cannot be told apart by this model (search/run.py
ranks them as equivalent): the dense band of the model's regime at tensor parallelism 1 and one sequence per
micro-batch (``ranking_band``), one number for a whole search.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from meshplan.files import PRESETS
from meshplan.specs.regime import training_regime


@dataclass(frozen=True)
class Band:
    """A quoted band: ± ``half_width`` (relative), holding for ``coverage`` of the runs it comes from out of source."""

    half_width: float
    coverage: float
    runs: int  # the measured runs it rests on
    sources: int  # the sources they come from
    basis: str  # which regime: "gpu=hopper, stack=megatron, kind=dense, work=large"
    note: str = ""  # one line where no measured run is like the plan, or where out of source it held for fewer
    conformal: float = 0.0  # the band a new run of the measured sources needs (module docstring): the ranking band

    def to_dict(self) -> dict[str, Any]:
        return {"half_width": self.half_width, "coverage": self.coverage, "runs": self.runs, "sources": self.sources,
                "basis": self.basis, "note": self.note}

    def describe(self) -> str:
        """``±12 % (80 % of 64 runs of 5 sources like it: gpu=hopper, ...)``, and the note where there is one."""
        text = (f"±{self.half_width:.0%} ({self.coverage:.0%} of {self.runs} measured runs from {self.sources} "
                f"source{'s' if self.sources != 1 else ''}, out of source: {self.basis or 'every regime'})")
        return f"{text}; {self.note}" if self.note else text


@lru_cache(maxsize=1)
def _tables() -> dict[str, Any]:
    """The tables as this module reads them: error_bands_core.json, the fields read here and the entries that hold
    ``min_runs`` runs of error_bands.json (a fifth of its bytes; benchmarks/docs/error_bands.py ``core``), parsed
    at every estimate's start-up."""
    return dict(json.loads((PRESETS / "error_bands_core.json").read_text())["tables"])


BANDS_FILE_TABLES = _tables  # the packaged tables, read once (tests, reports)


def key_of(regime: dict[str, str], axes: tuple[str, ...] | list[str]) -> str:
    return ", ".join(f"{a}={regime[a]}" for a in axes)


def band(table: str, regime: dict[str, str]) -> Band:
    """The band of ``table`` ("training", "memory", "serving/throughput" ...) for a plan of ``regime`` (module
    docstring)."""
    return table_band(_tables()[table], regime)


def basis(t: dict[str, Any], regime: dict[str, str]) -> tuple[dict[str, Any], list[str], list[str]]:
    """(the entry of the most specific level of table ``t`` whose regime holds ``min_runs`` runs, that level, the
    axes whose value ``regime`` holds no measured run of), the entry widened to the widest of its neighbours where
    any axis is unseen (module docstring)."""
    entries, least = t["entries"], t["min_runs"]
    unseen = [a for a in t["trust"] if t["seen"][a].get(regime.get(a, ""), 0) < least]
    for level in t["levels"]:
        if any(a in unseen for a in level):
            continue
        found = entries.get(key_of(regime, level))
        if found and found["runs"] >= least:
            break
    else:  # pragma: no cover  (the file's last level is every run, with all of them)
        level, found = [], entries[""]
    return (_widest(t, regime, level, unseen, found) if unseen else found), level, unseen


def table_band(t: dict[str, Any], regime: dict[str, str]) -> Band:
    """The band a table of the bands file (``t``) quotes for ``regime``."""
    found, level, unseen = basis(t, regime)
    where = key_of(regime, level)
    if not unseen:
        held = found.get("held", 1.0)
        note = (f"out of source, {held:.0%} of its {found['runs']} runs fell inside a band built without their "
                f"source: a source not yet measured may fall outside it more often" if held < t["coverage"] else "")
        return Band(found["band"], t["coverage"], found["runs"], found["sources"], where, note, found["conformal"])
    times = t["new_source"]["unseen"]
    half = max(found["band"], math.ceil(times * found["conformal"] * 1e4 - 1e-9) / 1e4)
    what = ", ".join(f"{a} {regime.get(a, '?')}" for a in unseen)
    return Band(half, t["coverage"], found["runs"], found["sources"], where,
                note=f"no measured run like this ({what}): band from the widest regime of the measured runs"
                     f"{' with ' + where if where else ''}, x{times:.1f} (how far new sources fell beyond their "
                     "neighbours' bands)",
                conformal=found["conformal"])


def _widest(t: dict[str, Any], regime: dict[str, str], level: list[str], unseen: list[str],
            found: dict[str, Any]) -> dict[str, Any]:
    """The widest band among the regimes that share the plan's values on ``level`` and hold ``min_runs`` runs, at
    the level that adds the unseen axes to it: the coarsest that adds any (or ``found`` where no level does), or in
    a table that says ``split_all`` the coarsest that adds them all. The peak-memory table says so: each of its
    sources is one GPU, stack and family, reading its own counter (benchmarks/docs/error_bands.py MEMORY_TRUST), so a
    level that adds one of them pools the others' sources, and a plan unlike all of them took the band of the
    measured stacks of one family pooled, one counter's errors beside another's, not the widest stack's."""
    above = [lv for lv in reversed(t["levels"]) if set(level) <= set(lv)]
    every = [lv for lv in above if set(unseen) <= set(lv)] if t.get("split_all") else []
    wider = next(iter(every), None) or next((lv for lv in above if set(unseen) & set(lv)), None)
    if wider is None:
        return found
    shared = {a: regime[a] for a in level}
    siblings = [e for k, e in t["entries"].items() if e["runs"] >= t["min_runs"] and _level_of(k) == set(wider)
                and all(f"{a}={v}" in k.split(", ") for a, v in shared.items())]
    return max([found, *siblings], key=lambda e: (e["conformal"], e["band"]))


def _level_of(key: str) -> set[str]:
    return {part.split("=", 1)[0] for part in key.split(", ")} if key else set()


def training_band(model: Any, cluster: Any, plan: Any, stack: Any) -> Band:
    """The step-time band of a training plan."""
    return band("training", training_regime(model, cluster, plan, stack))


def memory_band(model: Any, cluster: Any, plan: Any, stack: Any) -> Band:
    """The peak-memory band of a training plan."""
    return band("memory", training_regime(model, cluster, plan, stack))


def ranking_band(model: Any, cluster: Any, stack: Any) -> float:
    """The band within which the search cannot tell two plans of one model apart (module docstring). A MoE model
    takes its regime's dense band: its wider band comes from what every plan of it shares (the routing's balance, a
    release's dispatcher and host costs), an error of the model's level, not of one plan against another; ranking by
    it made a plan 31 % slower than the fastest 'equivalent' (Mixtral 8x7B on 64 H100)."""
    from meshplan.specs.plan import Plan  # noqa: PLC0415  (plan imports the spec modules)

    regime = training_regime(model, cluster, Plan(), stack) | {"kind": "dense"}
    return band("training", regime).conformal


def serving_band(metric: str, regime: dict[str, str]) -> Band:
    """The band of a serving metric ("throughput", "ttft", "tpot", "e2e") for a configuration of ``regime``."""
    return band(f"serving/{metric}", regime)


# the serving tables (benchmarks/docs/error_bands.py) and the measured metrics each quotes
SERVING_CLASSES = {"throughput": ("output_tokens_per_s", "output_tokens_per_s_per_gpu", "total_tokens_per_s",
                                  "requests_per_s", "input_tokens_per_s_per_gpu"),
                   "ttft": ("ttft_ms",), "tpot": ("itl_ms", "tpot_ms"), "e2e": ("e2e_latency_ms",)}
SERVING_METRICS = tuple(SERVING_CLASSES)


def serving_class(metric: str) -> str:
    """The serving table that quotes a measured ``metric`` ("itl_ms" -> "tpot")."""
    return next(name for name, metrics in SERVING_CLASSES.items() if metric in metrics)


def serving_ranking_band(regime: dict[str, str]) -> float:
    """The band within which the serving search cannot tell two configurations apart: its throughput band, at most
    the training search's on the same GPUs (the dense, large-work band of the GPU): a regime's serving band carries
    errors every configuration of it shares (an engine's host loop, a GPU priced slow, a build's kernels), which are
    no error of one configuration against another; uncapped, a configuration 17 % slower led on B200."""
    training = _tables()["training"]
    cap = next(training["entries"][k] for k in (f"gpu={regime['gpu']}, kind=dense, work=large", "kind=dense, "
                                                "work=large") if training["entries"].get(k, {}).get("runs", 0)
               >= training["min_runs"])
    return min(serving_band("throughput", regime).conformal, cap["conformal"])


def serving_latency_error(regime: dict[str, str], metric: str) -> tuple[dict[str, Any], str]:
    """(runs, median and p90 of the out-of-source |error| of a latency ``metric`` ("ttft", "tpot", "e2e") of the
    measured runs like ``regime``, which regime that is); ({}, "") where no run measured it."""
    t = _tables().get(f"serving/{metric}")
    if not t or not t["entries"]:
        return {}, ""
    b = band(f"serving/{metric}", regime)
    found = t["entries"].get(b.basis) or t["entries"][""]
    return {k: found[k] for k in ("runs", "median", "p90")}, b.basis or "every measured run"

