"""Measure ``Efficiency.ridge``, the exponent of the p-norm in which roofline.work_time combines a kernel's math and
HBM times, from single GEMMs timed on a lent GPU; print it, and the errors it gives on the fit GPU and the check GPU.

The data: data/measured/gpu/*-gemm-rows.json (benchmarks/measure/gemm_rows_gpu.py; docs/GEMM_GPU.md). The fit set is the
H200's decode GEMMs, bf16 and fp8 (945 GEMMs of Llama 3 8B and of one GPU's shard of Llama 3 70B at tp 8, 1-512
rows): the set that spans the ridge, from weight-streaming GEMMs at one row to compute-bound ones at 512, on one GPU.
Each is priced as docs/GEMM_GPU.md prices it (gemm_rows_doc.predicted: roofline.op_time under the serving model's
kernels), with every other constant as shipped. The objective is the mean |log(predicted / measured)|, minimised over
p in [1.5, 16] by a log-spaced scan and golden-section search around its best point (fit_efficiency.golden_section).
The H100's file, measured after, is the check: its decode and fp8 GEMMs, and both GPUs' training GEMMs, are not in
the fit.

The result is rounded to two significant figures before it is copied into meshplan/specs/efficiency.py by hand (the
objective is flat within a few per cent of its minimum: tests/test_fit_ridge.py shows it).

Run: python benchmarks/measure/fit_ridge.py
"""

from __future__ import annotations

import math
import sys
from functools import cache
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "docs")]
import gemm_rows_doc as rows  # noqa: E402  (benchmarks/docs/: how docs/GEMM_GPU.md prices a measured GEMM)
from fit_efficiency import golden_section  # noqa: E402

FIT = ("h200", ("decode", "fp8"))  # the GPU and the sets p is fitted on
CHECK = (("h200", "train"), ("h100", "decode"), ("h100", "fp8"), ("h100", "train"))  # not in the fit
BOUNDS = (1.5, 16.0)


def effs(p: float) -> dict:
    """The serving and training efficiencies of docs/GEMM_GPU.md with ``ridge`` = p."""
    return {name: eff.with_(ridge=p) for name, eff in rows.NOW.items()}


@cache
def _data(gpu: str) -> dict:
    """A GPU's newest gemm-rows file, read once (the fit prices it at some 30 exponents)."""
    return rows.load(rows.of_gpu(gpu))


def log_errors(gpu: str, kind: str, p: float) -> np.ndarray:
    """log(predicted / measured) of every timed GEMM of one set on one GPU, at ``ridge`` = p."""
    data = _data(gpu)
    acc = rows.accelerator(data)
    chosen = effs(p)
    return np.array([math.log(rows.predicted(r, kind, acc, chosen) / r["s"]) for r in rows.measured_rows(data, kind)])


def objective(p: float) -> float:
    """Mean |log error| over the fit set at ``ridge`` = p."""
    gpu, kinds = FIT
    return float(np.mean(np.abs(np.concatenate([log_errors(gpu, kind, p) for kind in kinds]))))


def fit() -> float:
    """The p that minimises ``objective``: a log-spaced scan, then golden-section search around its best point."""
    grid = np.geomspace(*BOUNDS, 25)
    i = int(np.argmin([objective(p) for p in grid]))
    return golden_section(objective, grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)])


def summary(gpu: str, kind: str, p: float) -> dict[str, float]:
    """Median and p90 |error| and the median signed error of one set at ``ridge`` = p (p = math.inf: the plain max)."""
    err = np.expm1(log_errors(gpu, kind, p))
    return {"n": err.size, "median": float(np.median(np.abs(err))), "p90": float(np.percentile(np.abs(err), 90)),
            "signed": float(np.median(err))}


def main() -> None:
    p = fit()
    print(f"fitted ridge = {p:.3f} (objective {objective(p):.5f}; plain max {objective(math.inf):.5f}); shipped "
          f"{rows.NOW['serve'].ridge}")
    for gpu, kind in ((FIT[0], k) for k in FIT[1]):
        _print(gpu, kind, p, "fit")
    for gpu, kind in CHECK:
        _print(gpu, kind, p, "check")


def _print(gpu: str, kind: str, p: float, role: str) -> None:
    now, plain = summary(gpu, kind, p), summary(gpu, kind, math.inf)
    print(f"{role:5} {gpu} {kind:6} n={now['n']:3d}  median |error| {100 * plain['median']:4.1f} -> "
          f"{100 * now['median']:4.1f} %  p90 {100 * plain['p90']:4.1f} -> {100 * now['p90']:4.1f} %  signed "
          f"{100 * plain['signed']:+5.1f} -> {100 * now['signed']:+5.1f} %")


if __name__ == "__main__":
    main()
