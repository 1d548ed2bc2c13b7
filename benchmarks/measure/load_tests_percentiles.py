"""The published load tests that print percentiles (data/serving/load_tests.jsonl), each run through the request-level
simulation (meshplan/serve/load/) and compared statistic by statistic: mean, p50, p90, p95 and p99 of TTFT, TPOT, ITL
and end-to-end latency, and output tokens/s, wherever the source printed them. Nothing is fitted on these runs: they
are checks.

Each record says what the benchmark tool sent: ``workload.request_rate`` (Poisson arrivals, the tools' default at a
finite rate) or every request at once (``request_rate_label`` "inf", vLLM bench serve's default), optionally capped by
``workload.concurrency`` clients (``--max-concurrency``: a closed loop); ``num_requests`` as printed ("Successful
requests"). Lengths:

- ``random``: every request ``input_len`` prompt tokens (vLLM's random dataset at range ratio 0) and the printed mean
  output (Total generated tokens / Successful requests): without ``--ignore-eos`` an output may end before
  ``output_len``, and the printed total is what was generated;
- ``sharegpt``: vLLM bench serve's ShareGPT filter (serve/load/lengths.py), each side rescaled to the printed mean where
  the record carries one (``mean_input_len`` / ``mean_output_len``: the model's own replies end at its EOS, shorter than
  the dataset's), else the dataset's published means.

The engine preset of each engine version (engine_version.preset_for), the record's TP and EP, its precisions, the
batch capped by the engine's max_seqs and the KV cache; seeds 0-2 of the length draws and arrivals (one draw where
nothing is random). The vLLM v0.6.0 runs of SGLang's comparison ran 10 scheduler steps at a time: their ITL is a
burst's gap, not compared.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from meshplan.serve.engine import load_engine
from meshplan.serve.engine_version import preset_for
from meshplan.serve.load.arrivals import Requests, poisson
from meshplan.serve.load.lengths import Lengths
from meshplan.serve.load.run import load_run
from meshplan.serve.load.summary import LoadResult
from meshplan.serve.plan import ServePlan
from meshplan.serve.precision import Quant
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model

LOAD_TESTS = Path(__file__).resolve().parents[2] / "data" / "serving" / "load_tests.jsonl"
METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_latency_ms")
STATS = ("mean", "p50", "p90", "p95", "p99")
THROUGHPUT = "output_tokens_per_s"
SEEDS = (0, 1, 2)
_SIM_NAME = {"ttft_ms": "ttft", "tpot_ms": "tpot", "itl_ms": "itl", "e2e_latency_ms": "e2e"}
_STAT_OF_PERCENTILE = {"median": "p50", "mean": "mean"}


@dataclass(frozen=True)
class Compared:
    """One load test: its id, source group, engine, and per (metric, statistic) the printed and simulated values."""

    id: str
    group: str
    engine: str
    printed: dict[tuple[str, str], float]
    simulated: dict[tuple[str, str], float]

    def errors(self) -> dict[tuple[str, str], float]:
        return {k: self.simulated[k] / v - 1 for k, v in self.printed.items()
                if v and np.isfinite(self.simulated.get(k, np.nan))}


def records() -> list[dict]:
    return [json.loads(line) for line in LOAD_TESTS.read_text().splitlines() if line.strip()]


def printed(record: dict) -> dict[tuple[str, str], float]:
    """The record's printed statistics by (metric, statistic): ``measured.percentiles`` (metric -> stat -> ms), or
    the older single-statistic form (``measured.percentile`` names the statistic of every latency field)."""
    m = record["measured"]
    out: dict[tuple[str, str], float] = {}
    if "percentiles" in m:
        out = {(metric, st): float(v) for metric, stats in m["percentiles"].items() for st, v in stats.items()}
    else:
        st = _STAT_OF_PERCENTILE[m["percentile"]]
        out = {(metric, st): float(m[metric]) for metric in METRICS if isinstance(m.get(metric), (int, float))}
    if record["engine"].startswith("vLLM 0.6") and "num-scheduler-steps" in record.get("notes", ""):
        out = {k: v for k, v in out.items() if k[0] != "itl_ms"}  # a burst's gap (module docstring)
    if isinstance(m.get(THROUGHPUT), (int, float)):
        out[(THROUGHPUT, "mean")] = float(m[THROUGHPUT])
    return out


def _scaled(values: np.ndarray, mean: float | None) -> np.ndarray:
    if not mean:
        return values
    return np.maximum(np.rint(values * (mean / values.mean())), 1).astype(int)


def requests(record: dict, seed: int) -> Requests:
    """The requests the benchmark tool sent (module docstring)."""
    w = record["workload"]
    n = int(record["measured"].get("successful_requests") or w["num_requests"])
    rng = np.random.default_rng(seed)
    if w["dataset"] == "random":
        out = max(int(round(w.get("mean_output_len") or w["output_len"])), 1)
        inp, outs = np.full(n, int(w["input_len"])), np.full(n, out)
    else:
        inp, outs = Lengths(w["dataset"]).sample(n, rng)
        inp, outs = _scaled(inp, w.get("mean_input_len")), _scaled(outs, w.get("mean_output_len"))
    if w.get("request_rate"):
        arrivals = poisson(float(w["request_rate"]), n, Lengths("fixed", 1, 1), seed).arrival
        return Requests(arrivals, inp, outs)
    return Requests(np.zeros(n), inp, outs, int(w.get("concurrency") or 0))


def _figures(r: LoadResult) -> dict[tuple[str, str], float]:
    out = {(THROUGHPUT, "mean"): r.output_tokens_per_s}
    for metric, name in _SIM_NAME.items():
        dist = getattr(r, name)
        out |= {(metric, f"p{p}"): 1e3 * v for p, v in dist.items()}
        out[(metric, "mean")] = 1e3 * r.mean.get(name, np.nan)
    return out


def simulate(record: dict) -> dict[tuple[str, str], float]:
    """The simulated statistics of one load test, the mean over seeds (one seed when nothing is drawn)."""
    engine = load_engine(preset_for(record["engine"]) or "generic")
    model = load_model(record["model"]["preset"])
    par, p = record["parallel"], record["precision"]
    cluster = load_system(record["hardware"]["preset"]).cluster(record["hardware"]["num_gpus"])
    quant = Quant(weights=p.get("weights") or "bf16", activations=p.get("activations") or "bf16",
                  kv_cache=p.get("kv_cache") or "bf16")
    plan = ServePlan(tp=par["tp"], ep=par.get("ep") or 1, batch=engine.max_seqs, quant=quant)
    w = record["workload"]
    drawn = w["dataset"] != "random" or bool(w.get("request_rate"))
    runs = [_figures(load_run(model, cluster, plan, requests(record, seed), engine))
            for seed in (SEEDS if drawn else SEEDS[:1])]
    return {k: float(np.mean([run[k] for run in runs])) for k in runs[0]}


def compared() -> list[Compared | str]:
    """Every load test compared, or a line saying why it could not be simulated."""
    out: list[Compared | str] = []
    for r in records():
        try:
            sim = simulate(r)
        except Exception as exc:  # noqa: BLE001 - a refusal is reported, not hidden
            out.append(f"{r['id']}: not simulated ({str(exc).splitlines()[0][:120]})")
            continue
        out.append(Compared(r["id"], r.get("group") or r["id"].split("_")[0], r["engine"], printed(r), sim))
    return out


def summary(rows: list[Compared]) -> dict[tuple[str, str], np.ndarray]:
    """Per (metric, statistic) the runs' simulated / printed − 1."""
    errs: dict[tuple[str, str], list[float]] = {}
    for c in rows:
        for k, e in c.errors().items():
            errs.setdefault(k, []).append(e)
    return {k: np.asarray(v) for k, v in errs.items()}


def ordered(keys) -> list[tuple[str, str]]:
    metrics = (*METRICS, THROUGHPUT)
    return sorted(keys, key=lambda k: (metrics.index(k[0]), STATS.index(k[1])))
