"""Make the pictures of docs/REPORTS.md (and the README): one of each kind, from the real commands.

Run: python benchmarks/screenshots.py [--quick]     (needs matplotlib; the report screenshot needs chromium)

1. ``meshplan report`` for Llama-3-70B on 256 H100s → a screenshot of the page in headless Chromium, and the
   report's best plans as PNGs: step-time breakdown, memory vs HBM, per-op roofline.
2. A pipeline timeline of GPT-3 175B on 1024 A100s (tp 8, pp 8, 2 chunks per rank, 8 micro-batches): the
   interleaved schedule with its bubbles, small enough to read every block.
3. ``meshplan sweep`` of Megatron 1T (global batch 4096) on A100 / H200 / B200 × NVLink 4 / 8 / 64 over
   1024–8192 GPUs, as in seed 003 (Subramanian et al. 2024, Fig. 4), and hardware-parameter sweeps of HBM
   and NIC bandwidth on H100 and B200. ``--quick`` uses fewer points (for a smoke test).
About 3 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import sys
import tempfile
import time
from pathlib import Path

from meshplan.cli import main as cli
from meshplan.estimate import estimate
from meshplan.report import plots
from meshplan.search import search
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.sweep import sweep_space

ROOT = Path(__file__).resolve().parents[1]
IMG = ROOT / "docs" / "img"

REPORT = ["report", "--model", "llama3-70b", "--system", "h100", "--gpus", "256", "--global-batch", "256",
          "--scaling", "64,128,256,512,1024"]
SCALING = ["sweep", "--model", "megatron-1t", "--global-batch", "4096", "--systems", "a100,h200,b200",
           "--nvlink", "4,8,64", "--gpus", "1024,2048,4096,8192"]
PARAMS = ["sweep", "--model", "gpt3-175b", "--global-batch", "1536", "--systems", "h100,b200", "--gpus",
          "512,2048", "--param", "hbm_bandwidth,nic_bandwidth", "--factors", "0.25,0.5,1,2,4"]


def run(args: list[str]) -> None:
    print("$ meshplan " + " ".join(args), flush=True)
    start = time.perf_counter()
    code = cli(args)
    if code:
        sys.exit(f"meshplan {args[0]} failed with status {code}")
    print(f"  ({time.perf_counter() - start:.0f} s)", flush=True)


def report_pictures(tmp: Path, quick: bool) -> None:
    html = tmp / "report.html"
    run(REPORT + (["--scaling", "128,256,512"] if quick else []) + ["-o", str(html)])
    from meshplan.report.browser import Chromium, find_chromium

    if find_chromium() is None:
        print("  no chromium: skipping the report screenshot (apt-get install chromium)")
    else:
        with Chromium(width=1280, height=1000) as browser:
            page = browser.open(html)
            assert page.errors == [], page.errors
            page.screenshot(IMG / "report.png")
        print(f"  wrote {IMG / 'report.png'} ({html.stat().st_size / 1e6:.1f} MB report)")
    # the same search as the report, for the stand-alone pictures of its best plans
    model, cluster = load_model("llama3-70b"), load_system("h100").cluster(256)
    result = search(model, cluster, sweep_space(256), top_k=4)
    plots.save(plots.breakdown_figure(result.plans), IMG / "breakdown.png")
    plots.save(plots.memory_figure(result.plans), IMG / "memory.png")
    plots.save(plots.roofline_figure(result.plans[0]), IMG / "roofline.png")
    print(f"  wrote breakdown.png, memory.png, roofline.png ({result.plans[0].plan.describe()})")


def timeline_picture() -> None:
    model, cluster = load_model("gpt3-175b"), load_system("a100").cluster(1024)
    plan = Plan(dp=16, tp=8, pp=8, vpp=2, micro_batch=1, global_batch=128, sequence_parallel=True,
                recompute="selective", zero=1, schedule="interleaved")
    est = estimate(model, cluster, plan)
    plots.save(plots.timeline_figure(est), IMG / "timeline.png")
    print(f"  wrote timeline.png ({plan.describe()})")


def sweep_pictures(tmp: Path, quick: bool) -> None:
    scaling = SCALING if not quick else [a if a != "1024,2048,4096,8192" else "1024,2048" for a in SCALING]
    run(scaling + ["--placements", "default"] * quick + ["-o", str(tmp / "scaling")])
    shutil.copy(tmp / "scaling" / "scaling.png", IMG / "scaling.png")
    shutil.copy(tmp / "scaling" / "sweep.csv", IMG.parent / "scaling-megatron-1t.csv")
    print("  " + nvlink_gap(IMG.parent / "scaling-megatron-1t.csv"))
    params = PARAMS if not quick else [a if a != "0.25,0.5,1,2,4" else "0.5,1,2" for a in PARAMS]
    run(params + ["--placements", "default"] * quick + ["-o", str(tmp / "params")])
    for name in ("param-hbm_bandwidth.png", "param-nic_bandwidth.png"):
        shutil.copy(tmp / "params" / name, IMG / name)
    print("  wrote scaling.png, param-hbm_bandwidth.png, param-nic_bandwidth.png")


def nvlink_gap(path: Path) -> str:
    """The MFU points that an NVLink domain of 64 gains over one of 4, per GPU count, across the systems
    (quoted in docs/REPORTS.md)."""
    mfu: dict[tuple[str, int], dict[int, float]] = {}
    with path.open() as f:
        for row in csv.DictReader(f):
            if row["feasible"] == "True":
                mfu.setdefault((row["system"], int(row["gpus"])), {})[int(row["nvlink_domain"])] = float(row["mfu"])
    gaps: dict[int, list[float]] = {}
    for (_, gpus), by_domain in sorted(mfu.items()):
        if 4 in by_domain and 64 in by_domain:
            gaps.setdefault(gpus, []).append(100 * (by_domain[64] - by_domain[4]))
    return "MFU gained by NVLink 64 over 4: " + ", ".join(
        f"{min(g):.1f}-{max(g):.1f} points at {n} GPUs" for n, g in sorted(gaps.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sweep points (smoke test)")
    args = parser.parse_args()
    IMG.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        report_pictures(Path(tmp), args.quick)
        timeline_picture()
        sweep_pictures(Path(tmp), args.quick)
    print(f"done in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
