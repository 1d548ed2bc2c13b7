"""docs/GEMM_GPU.md: single GEMMs measured on a lent H200 against meshplan's price for each (issue 46: a GEMM's
kernel, split-K and its reduction at the row counts of decode and small-model training), rendered from the committed
data file without a GPU:

    python benchmarks/docs/gemm_rows_doc.py            # writes docs/GEMM_GPU.md

The data: data/measured/gpu/*-gemm-rows.json, made by benchmarks/measure/gemm_rows_gpu.py (its docstring says what each
set and timing is). meshplan prices each GEMM as one op on its preset of the GPU (roofline.op_time: the kernel's fixed
time, its math and traffic times combined (roofline.work_time), a split-K reduction kernel where specs/gemm_shape.py
splits k): a decode GEMM as the serving iteration builds it (cost/decode.gemm: the weights, the input and the 16-bit
output) under the serving model's kernels (serve/efficiency.py, ``SERVE_DEFAULT``), a training GEMM with its three
operands in 16 bits under training's (specs/efficiency.py, ``DEFAULT``). Each table sets the shipped model beside the
one before these files were used (``BEFORE``: without the 64-wide tiles the measured kernels use, and with the plain
roofline, the larger of a GEMM's math and traffic times, where the shipped one takes their p-norm near the ridge point:
roofline.work_time, whose exponent benchmarks/measure/fit_ridge.py fits on the H200's decode GEMMs), at the same
constants; a last table per GPU shows the ridge alone (``PLAIN``: today's tiles, the plain roofline).
tests/test_docs.py renders it again and compares; tests/test_gemm_rows_gpu.py checks the arithmetic.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path
from typing import ClassVar

from meshplan.cost.decode import gemm
from meshplan.cost.records import OpCost
from meshplan.roofline import compute_time, memory_time, op_time
from meshplan.serve.efficiency import SERVE_DEFAULT, ServeEfficiency
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.specs.hardware import Accelerator, load_system

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_gpu_doc import SYSTEM  # noqa: E402  (the same folder: the lent GPUs' names and their presets)

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data" / "measured" / "gpu"
DOC = ROOT / "docs" / "GEMM_GPU.md"
OLD_TRAINING = ((128, 128), (128, 256), (256, 128))  # specs/gemm_shape.TILES before 2026-11-27
OLD_SERVING = ((16, 128), (32, 128), (64, 128), *OLD_TRAINING)  # serve/efficiency.SERVE_TILES before it
SHOWN_ROWS = (1, 8, 16, 17, 32, 33, 48, 64, 128, 192, 256, 512)  # the decode table's row counts


@dataclass(frozen=True, kw_only=True)
class _OldServe(ServeEfficiency):
    TILES: ClassVar[tuple[tuple[int, int], ...]] = OLD_SERVING


@dataclass(frozen=True, kw_only=True)
class _OldTrain(Efficiency):
    TILES: ClassVar[tuple[tuple[int, int], ...]] = OLD_TRAINING


def _constants(eff: Efficiency) -> dict:
    return {f.name: getattr(eff, f.name) for f in fields(eff) if f.init}


# before: the old tiles and the plain roofline (the larger of math and traffic: ridge = inf), at the same constants
BEFORE = {"serve": _OldServe(**_constants(SERVE_DEFAULT) | {"ridge": math.inf}),
          "train": _OldTrain(**_constants(DEFAULT) | {"ridge": math.inf})}
NOW = {"serve": SERVE_DEFAULT, "train": DEFAULT}
PLAIN = {name: eff.with_(ridge=math.inf) for name, eff in NOW.items()}  # today's tiles, the plain roofline


def files() -> list[Path]:
    """Every gemm-rows file, oldest first (data/measured/gpu/<date>-<gpu>-gemm-rows.json)."""
    return sorted(DATA.glob("*-gemm-rows.json"))


def of_gpu(gpu: str) -> Path:
    """The newest gemm-rows file of a GPU ("h200")."""
    return [path for path in files() if f"-{gpu}-" in path.name][-1]


def load(file: Path) -> dict:
    return json.loads(file.read_text()) | {"file": file.name}


def accelerator(data: dict) -> Accelerator:
    return _preset(data["machine"]["gpu"])


@cache
def _preset(gpu: str) -> Accelerator:
    """The preset of a lent GPU by its name, read once."""
    return load_system(SYSTEM[gpu]).accelerator


def op_of(row: dict, kind: str) -> OpCost:
    """The op meshplan prices for a measured GEMM: ``kind`` decode (bf16), fp8 (weights and input in 8 bits) or
    train (three 16-bit operands)."""
    m, n, k = float(row["m"]), float(row["n"]), float(row["k"])
    if kind == "train":
        return OpCost("gemm", "fwd", "gemm", 2 * m * n * k, 2 * (m * k + k * n + m * n), m=m, n=n, k=k)
    width = 1.0 if kind == "fp8" else 2.0
    return gemm(row["gemm"], m, k, n, width, width)


def predicted(row: dict, kind: str, acc: Accelerator, effs: dict | None = None) -> float:
    """meshplan's seconds for the measured GEMM ``row`` of set ``kind`` (module docstring)."""
    eff = (effs or NOW)["train" if kind == "train" else "serve"]
    return float(op_time(op_of(row, kind), acc, "fp8" if kind == "fp8" else "bf16", eff))


def split_predicted(row: dict, kind: str, acc: Accelerator, effs: dict | None = None) -> bool:
    eff = (effs or NOW)["train" if kind == "train" else "serve"]
    return bool(eff.split_k_reductions(float(row["m"]), float(row["n"]), float(row["k"]), acc.num_sms) > 0)


def split_measured(row: dict) -> bool:
    """cuBLAS split k: its GEMM kernel's name says ``splitK`` (a ``splitKreduce_kernel`` follows it)."""
    return any("splitK" in k["name"] and "reduce" not in k["name"] for k in row["kernels"])


def kernel_tile(row: dict) -> str:
    """The measured GEMM kernel's tile, nvjet_sm90_tst_<a>x<b>_… (for a decode GEMM a covers the weight's output
    features and b the rows: cuBLAS swaps the operands), and " splitK" where it split k."""
    name = next(k["name"] for k in row["kernels"] if "nvjet" in k["name"] and "reduce" not in k["name"])
    return name.split("_")[3] + (" splitK" if split_measured(row) else "")


def measured_rows(data: dict, kind: str) -> list[dict]:
    """The timed rows of a set (``decode``, ``fp8``, ``train``); fp8 rows the call refused have no time."""
    rows = data["training" if kind == "train" else kind]
    return [r for r in rows if "s" in r]


def errors(data: dict, kind: str, effs: dict | None = None) -> list[float]:
    acc = accelerator(data)
    return [predicted(r, kind, acc, effs) / r["s"] - 1 for r in measured_rows(data, kind)]


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def summary(data: dict, kind: str, effs: dict | None = None) -> dict:
    """Median and p90 |error|, median signed, and how often meshplan's split-K choice is cuBLAS's (profiled rows)."""
    err = errors(data, kind, effs)
    acc = accelerator(data)
    profiled = [r for r in measured_rows(data, kind) if "kernels" in r]
    agree = sum(split_predicted(r, kind, acc, effs) == split_measured(r) for r in profiled)
    return {"n": len(err), "median": statistics.median(abs(e) for e in err), "p90": _p90([abs(e) for e in err]),
            "signed": statistics.median(err), "split_agree": agree, "profiled": len(profiled)}


def reduce_kernels(data: dict) -> list[float]:
    """Seconds of every profiled ``splitKreduce_kernel``, all sets."""
    rows = [r for kind in ("decode", "fp8", "train") for r in measured_rows(data, kind) if "kernels" in r]
    return [k["us"] * 1e-6 / k["count"] for r in rows for k in r["kernels"] if "splitKreduce" in k["name"]]


def drops(data: dict, least: float = 0.05) -> list[tuple[str, int, int, float]]:
    """Where a decode GEMM measured faster on more rows, by more than ``least`` of its time: (matrix, m before, m
    after, seconds saved)."""
    out = []
    series: dict[str, list[dict]] = {}
    for r in measured_rows(data, "decode"):
        series.setdefault(f"{r['model']} {r['gemm']}", []).append(r)
    for name, rows in series.items():
        rows.sort(key=lambda r: r["m"])
        for a, b in zip(rows, rows[1:], strict=False):
            if b["s"] < a["s"] * (1 - least):
                out.append((name, a["m"], b["m"], a["s"] - b["s"]))
    return out


def _pct(x: float) -> str:
    return f"{100 * x:+.1f} %"


def _us(x: float) -> str:
    return f"{x * 1e6:.1f}"


HEADER = (
    "# Single GEMMs on a lent GPU, and meshplan's price for each\n\n"
    "Generated by `python benchmarks/docs/gemm_rows_doc.py` from `data/measured/gpu/*-gemm-rows.json` (made by "
    "`benchmarks/measure/gemm_rows_gpu.py` on lent GPUs; clocks not locked). Each time is the median over runs of 20 "
    "GEMMs replayed from one CUDA graph: the GPU's time, no host between kernels. Decode GEMMs read weights held in "
    "copies three times the L2 cache together, so each reads its weight from HBM. meshplan prices each as one op on "
    "its preset of the GPU (`roofline.op_time`: the kernel's fixed time, its math and traffic times combined, and a "
    "split-K reduction kernel where `specs/gemm_shape.py` splits k). *Before*: the model before these files were used "
    "(the tile set before 2026-11-27 and the plain roofline, the larger of a GEMM's math and traffic times), at the "
    "same constants; "
    "*now*: the shipped one, which adds the 64-wide tiles the measured kernels use (cuBLAS's `nvjet_sm90_tst_64x8…` "
    "kernels at one to 48 rows, `…_128x64…` in training) and takes the p-norm of math and traffic, which a kernel "
    "near the ridge point needs (`roofline.work_time`, p = `Efficiency.ridge`, fitted on the H200's decode GEMMs by "
    "`benchmarks/measure/fit_ridge.py`). Both were chosen from the H200's file; the H100's was measured after, as a "
    "check.\n\n")


def header(data: dict) -> str:
    m = data["machine"]
    return (f"## {m['gpu']}\n\n`data/measured/gpu/{data['file']}`: {m['date']}, PyTorch {m['torch']}, CUDA "
            f"{m['cuda']}, {data['repeat']} GEMMs a timed run.\n\n")


def summary_table(data: dict) -> str:
    lines = ["| set | GEMMs | median \\|error\\| before → now | p90 before → now | median signed now "
             "| split-K as cuBLAS chose, before → now |", "|---|---:|---:|---:|---:|---:|"]
    for kind, label in (("decode", "decode, bf16"), ("fp8", "decode, fp8 (`torch._scaled_mm`)"),
                        ("train", "training, bf16")):
        old, new = summary(data, kind, BEFORE), summary(data, kind)
        lines.append(f"| {label} | {new['n']} | {100 * old['median']:.1f} → {100 * new['median']:.1f} % | "
                     f"{100 * old['p90']:.1f} → {100 * new['p90']:.1f} % | {_pct(new['signed'])} | "
                     f"{old['split_agree']} → {new['split_agree']} of {new['profiled']} |")
    reduce = reduce_kernels(data)
    acc = accelerator(data)
    return ("### Summary\n\n" + "\n".join(lines) + "\n\n"
            f"cuBLAS's split-K reduction kernel (`splitKreduce_kernel`) ran {len(reduce)} times in the profiled "
            f"GEMMs, {_us(min(reduce))}-{_us(max(reduce))} µs each (median {_us(statistics.median(reduce))}); "
            f"meshplan prices it at the accelerator's `kernel_overhead`, {_us(acc.kernel_overhead)} µs.\n\n")


def decode_table(data: dict, kind: str) -> str:
    acc = accelerator(data)
    lines = ["| matrix | n × k | rows | measured µs | meshplan µs (error) | before | cuBLAS kernel | meshplan splits |",
             "|---|---|---:|---:|---:|---:|---|---|"]
    for r in measured_rows(data, kind):
        if r["m"] not in SHOWN_ROWS:
            continue
        now, old = predicted(r, kind, acc), predicted(r, kind, acc, BEFORE)
        tile = kernel_tile(r) if "kernels" in r else ""
        split = ("yes" if split_predicted(r, kind, acc) else "no") if "kernels" in r else ""
        lines.append(f"| {r['model']} {r['gemm']} | {r['n']:,} × {r['k']:,} | {r['m']} | {_us(r['s'])} | "
                     f"{_us(now)} ({_pct(now / r['s'] - 1)}) | {_pct(old / r['s'] - 1)} | {tile} | {split} |")
    return "\n".join(lines) + "\n\n"


def training_table(data: dict) -> str:
    acc = accelerator(data)
    lines = ["| layer (out × in) | tokens | pass | m × n × k | measured µs | meshplan µs (error) | before "
             "| cuBLAS kernel |", "|---|---:|---|---|---:|---:|---:|---|"]
    for r in measured_rows(data, "train"):
        now, old = predicted(r, "train", acc), predicted(r, "train", acc, BEFORE)
        lines.append(f"| {r['layer'][0]:,} × {r['layer'][1]:,} | {r['tokens']:,} | {r['gemm']} | "
                     f"{r['m']:,} × {r['n']:,} × {r['k']:,} | {_us(r['s'])} | {_us(now)} ({_pct(now / r['s'] - 1)}) | "
                     f"{_pct(old / r['s'] - 1)} | {kernel_tile(r)} |")
    return "\n".join(lines) + "\n\n"


def drops_text(data: dict) -> str:
    found = drops(data, 0.10)
    items = "; ".join(f"{name} {a} → {b} rows, −{_us(s)} µs" for name, a, b, s in found)
    return ("### Where more rows ran faster\n\n"
            "A GEMM's time is not monotone in its rows on the GPU either: cuBLAS changes kernel (tile, split) at some "
            f"row counts. {len(drops(data))} steps from one timed row count to the next ran faster by more than 5 %; "
            f"by more than 10 %: {items or 'none'}. meshplan's own steps sit where its chosen kernel stops splitting "
            "k (one reduction kernel fewer).\n\n")


def _balance(row: dict, kind: str, acc: Accelerator) -> float:
    """The smaller of a GEMM's math and traffic times over the larger (1 at the ridge point), as meshplan prices
    them."""
    op, eff = op_of(row, kind), NOW["train" if kind == "train" else "serve"]
    compute = float(compute_time(op, acc, "fp8" if kind == "fp8" else "bf16", eff))
    memory = float(memory_time(op, acc, eff))
    return min(compute, memory) / max(compute, memory)


def ridge_table(data: dict) -> str:
    """Measured over priced time by how close a GEMM's math and traffic times are, under the plain roofline and under
    the p-norm (today's tiles both)."""
    acc = accelerator(data)
    bands = ((0.0, 0.2), (0.2, 0.4), (0.4, 0.6), (0.6, 0.8), (0.8, 0.9), (0.9, 1.0))
    lines = ["| set | smaller / larger time | GEMMs | measured / priced, plain roofline | with the ridge |",
             "|---|---|---:|---:|---:|"]
    for kind, label in (("decode", "decode, bf16"), ("fp8", "decode, fp8"), ("train", "training, bf16")):
        rows = measured_rows(data, kind)
        balance = [_balance(r, kind, acc) for r in rows]
        for lo, hi in bands:
            chosen = [r for r, b in zip(rows, balance, strict=True) if lo <= b < hi or (hi == 1.0 and b == 1.0)]
            if not chosen:
                continue
            plain = statistics.median(r["s"] / predicted(r, kind, acc, PLAIN) for r in chosen)
            ridge = statistics.median(r["s"] / predicted(r, kind, acc) for r in chosen)
            lines.append(f"| {label} | {lo:.1f}-{hi:.1f} | {len(chosen)} | {plain:.3f} | {ridge:.3f} |")
    eff = NOW["serve"]
    return ("### The ridge\n\n"
            "A GEMM whose math and HBM traffic take about as long reaches neither roof: its loads and its MMAs overlap "
            "through a pipeline of a few stages, and every stall of one idles the other. Under the plain roofline the "
            "measured time grows past the priced one as the two times approach each other (median measured / priced, "
            f"by the smaller time over the larger); their p-norm (p = {eff.ridge:g}, "
            f"2^(1/p) = {2 ** (1 / eff.ridge):.3f} at the ridge) takes most of it away.\n\n"
            + "\n".join(lines) + "\n\n")


def render(data: dict) -> str:
    return (header(data) + summary_table(data) + ridge_table(data)
            + "### Decode GEMMs, bf16\n\n" + decode_table(data, "decode")
            + "### Decode GEMMs, fp8\n\n" + decode_table(data, "fp8")
            + "### A linear layer's three GEMMs in training, bf16\n\n" + training_table(data)
            + drops_text(data))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--doc", type=Path, default=DOC)
    args = ap.parse_args(argv)
    args.doc.write_text(HEADER + "".join(render(load(of_gpu(gpu))) for gpu in ("h200", "h100")))
    print(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
