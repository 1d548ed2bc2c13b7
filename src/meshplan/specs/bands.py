"""How far a predicted step time may be from the measured one: the error band of comparable published runs.

``presets/error_bands.json`` (written by benchmarks/accuracy.py from the runs of docs/ACCURACY.md) holds, per GPU
architecture and model kind (dense / MoE), the 80th percentile of |predicted / measured − 1| and the runs behind it;
an architecture it does not list takes the overall band. Two plans whose step times differ by less than the band
cannot be told apart by this model (search/run.py ranks them as equivalent).
"""

from __future__ import annotations

import json
from functools import lru_cache

from meshplan.files import PRESETS


@lru_cache(maxsize=1)
def _bands() -> dict:
    return json.loads((PRESETS / "error_bands.json").read_text())


def ranking_band(architecture: str) -> float:
    """The band within which the search cannot tell two plans of one model apart: the dense runs' band of the
    architecture, for MoE models too. A MoE model's wider band (Hopper 41 % against 8.6 % dense) comes from what every
    plan of it shares (the routing's balance, a release's dispatcher and host costs: docs/ACCURACY.md's MoE groups), an
    error of the model's level, not of one plan against another; ranking by it made a plan 31 % slower than the
    fastest 'equivalent' (Mixtral 8x7B on 64 H100)."""
    return error_band(architecture, False)


def error_band(architecture: str, moe: bool) -> float:
    """The relative half-width of the step-time band for a GPU architecture and a dense or MoE model."""
    data = _bands()
    found = data["bands"].get(f"{architecture or 'unstated'}/{'moe' if moe else 'dense'}")
    return float((found or data["overall"])["band"])


@lru_cache(maxsize=1)
def _serving() -> dict:
    """``presets/serving_errors.json``: the serving model's errors on the published serving runs, per GPU
    architecture (written by benchmarks/accuracy_inference.py from docs/ACCURACY_INFERENCE.md's runs)."""
    return json.loads((PRESETS / "serving_errors.json").read_text())


def serving_band(architecture: str) -> float:
    """The band within which the serving search cannot tell two configurations apart: the median |predicted /
    measured − 1| of the throughput of the published serving runs on the architecture (half of them were predicted
    closer than it), else of every run, at most ``ranking_band`` (the training search's, the dense runs' band of the
    same GPUs)."""
    data = _serving()
    found = data["architectures"].get(architecture or "unstated") or {}
    median = float((found if found.get("runs") else data["overall"])["median"])
    # at most the training search's band on the same GPUs: a generation's serving median carries errors every
    # configuration of a run shares (a GPU priced slow, an unstated layout: Blackwell's 23-37 %), which are no
    # error of one configuration against another; uncapped, a configuration 17 % slower led on B200
    return min(median, ranking_band(architecture))


def serving_latency_error(architecture: str, metric: str) -> tuple[dict, str]:
    """(runs, median and p90 of |error| of a latency ``metric`` such as "ttft_ms", where they come from) on the
    published runs of the architecture that measured it, else on every run that did (the file's ``overall``);
    ({}, "") when none did."""
    data = _serving()
    found = data["architectures"].get(architecture or "unstated") or {}
    mine = (found.get("latency") or {}).get(metric) or {}
    if mine.get("runs"):
        return mine, f"{found['name']} GPUs"
    every = (data["overall"].get("latency") or {}).get(metric) or {}
    return (every, "every GPU generation") if every.get("runs") else ({}, "")
