"""Make the pictures of docs/REPORTS.md (and the README): one of each kind, from the real commands.

Run: python benchmarks/docs/screenshots.py [--quick] [--out DIR] [--only report,serve,plans,timeline,sweeps]
(needs matplotlib; the report screenshots need chromium)

1. ``meshplan report`` for Llama-3-70B on 256 H100s → screenshots of the page in headless Chromium (Playwright): its
   top, the plan space, the comparison and the trust panel; and the report's best plans as PNGs (matplotlib, the
   Python API's pictures): step-time breakdown, memory vs HBM, per-op roofline. ``meshplan serve ... --report`` for
   Llama-3-70B on 16 H100s (docs/SERVING.md's first command) → the serving report's top and configuration space.
2. A pipeline timeline of GPT-3 175B on 1024 A100s (tp 8, pp 8, 2 chunks per rank, 8 micro-batches): the
   interleaved schedule with its bubbles, small enough to read every block.
3. ``meshplan sweep`` of Megatron 1T (global batch 4096) on A100 / H200 / B200 × NVLink 4 / 8 / 64 over
   1024–8192 GPUs, as in seed 003 (Subramanian et al. 2024, Fig. 4), and hardware-parameter sweeps of HBM
   and NIC bandwidth on H100 and B200. ``--quick`` uses fewer points (for a smoke test).
About a minute on 2 cores. The sweeps' rows go to docs/scaling-megatron-1t.csv and docs/whatif-gpt3-175b.csv; ``--out
DIR`` writes DIR/img/*.png and DIR/*.csv instead of docs/.

Pixels differ between matplotlib and Chromium versions, so each PNG records the SHA-256 of what it was drawn from
(a PNG text chunk 'meshplan-inputs': the sweep's CSV, the estimates' data, the report's HTML without the charts'
runtime); tests/test_docs.py compares those with the committed CSVs or a fresh run's.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import re
import shutil
import struct
import sys
import tempfile
import time
import zlib
from pathlib import Path

from meshplan.cli import main as cli
from meshplan.estimate import estimate
from meshplan.report import plots
from meshplan.search import search
from meshplan.search.sweep import sweep_space
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SCALING_CSV = "scaling-megatron-1t.csv"  # the rows of the strong-scaling sweep (scaling.png)
WHATIF_CSV = "whatif-gpt3-175b.csv"  # the rows of the hardware what-if sweeps (param-*.png)
INPUTS = b"meshplan-inputs"  # the PNG text keyword under which a picture records the digest of its inputs

# (picture, CSS selector) of the report's sections shown in docs/REPORTS.md
REPORT_SHOTS = (("plan-space.png", "#space"), ("compare.png", "#compare"), ("trust.png", "#trust"))
REPORT = ["report", "--model", "llama3-70b", "--system", "h100", "--gpus", "256", "--global-batch", "256",
          "--scaling", "64,128,256,512,1024"]
# the serving report of docs/SERVING.md's first command (docs/img/serve.png: its top; serve-space.png: the space)
SERVE = ["serve", "--model", "llama3-70b", "--system", "h100", "--gpus", "16", "--input-len", "1024", "--output-len",
         "256", "--ttft-slo", "1s", "--tpot-slo", "50ms", "--price", "2.5", "--report"]
SERVE_SHOTS = (("serve-space.png", "#space"),)
GROUPS = ("report", "serve", "plans", "timeline", "sweeps")  # what --only may name
SCALING = ["sweep", "--model", "megatron-1t", "--global-batch", "4096", "--systems", "a100,h200,b200",
           "--nvlink", "4,8,64", "--gpus", "1024,2048,4096,8192", "--framework", "any"]  # every plan, as seed 003
PARAMS = ["sweep", "--model", "gpt3-175b", "--global-batch", "1536", "--systems", "h100,b200", "--gpus",
          "512,2048", "--param", "hbm_bandwidth,nic_bandwidth", "--factors", "0.25,0.5,1,2,4", "--framework", "any"]


def run(args: list[str]) -> None:
    print("$ meshplan " + " ".join(args), flush=True)
    start = time.perf_counter()
    code = cli(args)
    if code:
        sys.exit(f"meshplan {args[0]} failed with status {code}")
    print(f"  ({time.perf_counter() - start:.0f} s)", flush=True)


def with_option(args: list[str], option: str, value: str) -> list[str]:
    """``args`` with ``option``'s value replaced."""
    at = args.index(option) + 1
    return args[:at] + [value] + args[at + 1:]


def digest(data: bytes | object) -> str:
    """SHA-256 of bytes, or of plain data as sorted JSON."""
    raw = data if isinstance(data, bytes) else json.dumps(data, sort_keys=True).encode()
    return hashlib.sha256(raw).hexdigest()


def html_inputs(html: str) -> str:
    """The digest of a report without the charts' runtime (the Vega libraries, the first script of its head, and their
    versions) and the time its search took: its text, tables, numbers and the charts' specs and data."""
    html = re.sub(r"<head>(.*?)<script>.*?</script>", r"<head>\1", html, count=1, flags=re.S)
    html = re.sub(r"Charts: Vega [0-9.]+, Vega-Lite [0-9.]+", "Charts: Vega -, Vega-Lite -", html)
    return digest(re.sub(r"search took [0-9.]+ s", "search took - s", html).encode())


def stamp(png: Path, inputs: str) -> Path:
    """Record ``inputs`` in ``png`` as a tEXt chunk before its IEND chunk."""
    raw = png.read_bytes()
    if raw[-8:-4] != b"IEND":
        raise ValueError(f"{png}: not a PNG ending in IEND")
    body = INPUTS + b"\0" + inputs.encode("latin-1")
    chunk = struct.pack(">I", len(body)) + b"tEXt" + body + struct.pack(">I", zlib.crc32(b"tEXt" + body))
    png.write_bytes(raw[:-12] + chunk + raw[-12:])
    return png


def recorded_inputs(png: Path) -> str | None:
    """What ``png`` records under INPUTS (``stamp``, or matplotlib's ``savefig(metadata=...)``), else None."""
    raw, at = png.read_bytes(), 8
    while at + 8 <= len(raw):
        size, kind = struct.unpack(">I4s", raw[at:at + 8])
        key, _, value = raw[at + 8:at + 8 + size].partition(b"\0")
        if kind == b"tEXt" and key == INPUTS:
            return value.decode("latin-1")
        at += 12 + size
    return None


def report_pictures(tmp: Path, img: Path, quick: bool) -> None:
    html = tmp / "report.html"
    run(REPORT + (["--scaling", "128,256,512"] if quick else []) + ["-o", str(html)])
    screenshots(html, img, "report.png", REPORT_SHOTS)


def serve_pictures(tmp: Path, img: Path) -> None:
    html = tmp / "serve.html"
    run(SERVE + [str(html)])
    screenshots(html, img, "serve.png", SERVE_SHOTS)


def screenshots(html: Path, img: Path, top: str, sections: tuple[tuple[str, str], ...]) -> None:
    """The top of a report (1280 × 1000 px) as ``top`` and its ``sections`` (picture, CSS selector) in headless
    Chromium, each stamped with the digest of the page's HTML (html_inputs)."""
    from meshplan.report.browser import chromium, find_chromium, open_page

    if find_chromium() is None:
        print(f"  no chromium: skipping the screenshots of {html.name} (apt-get install chromium)")
        return
    inputs = html_inputs(html.read_text())
    with chromium() as browser:
        page = open_page(browser, html, width=1280, height=1000, ready="window.meshplan && window.meshplan.ready")
        assert page.meshplan_errors == [], page.meshplan_errors
        page.screenshot(path=img / top)
        written = [top]
        for name, selector in sections:
            if page.locator(selector).count():
                page.locator(selector).screenshot(path=img / name)
                written.append(name)
    for name in written:
        stamp(img / name, inputs)
    print(f"  wrote {', '.join(written)} ({html.stat().st_size:,} bytes of {html.name})")


def drawn(est) -> dict:
    """What a picture of an estimate is drawn from: its data without the axes' mesh tiers (no picture shows them)."""
    return {k: v for k, v in est.to_dict().items() if k != "tiers"}


def plan_pictures(img: Path) -> None:
    """The same search as the report, for the stand-alone pictures of its best plans."""
    model, cluster = load_model("llama3-70b"), load_system("h100").cluster(256)
    result = search(model, cluster, sweep_space(256, stack=Stack()), top_k=4)  # every plan meshplan models
    plans = digest([drawn(est) for est in result.plans])
    stamp(plots.save(plots.breakdown_figure(result.plans), img / "breakdown.png"), plans)
    stamp(plots.save(plots.memory_figure(result.plans), img / "memory.png"), plans)
    stamp(plots.save(plots.roofline_figure(result.plans[0]), img / "roofline.png"), digest(drawn(result.plans[0])))
    print(f"  wrote breakdown.png, memory.png, roofline.png ({result.plans[0].plan.describe()})")


def timeline_picture(img: Path) -> float:
    """The timeline of GPT-3 175B on 1024 A100s; returns its bubble's share of the pipelined time."""
    model, cluster = load_model("gpt3-175b"), load_system("a100").cluster(1024)
    plan = Plan(dp=16, tp=8, pp=8, vpp=2, micro_batch=1, global_batch=128, sequence_parallel=True,
                recompute="selective", zero=1, schedule="interleaved", grad_bytes=2)
    est = estimate(model, cluster, plan, Stack())  # the generic stack (DP overlapped), as drawn
    pipeline = plots.pipeline_run(est)
    inputs = digest({"estimate": drawn(est), "starts": pipeline.timeline.starts, "ends": pipeline.timeline.ends})
    stamp(plots.save(plots.timeline_figure(est, pipeline), img / "timeline.png"), inputs)
    idle = pipeline.timeline.idle_fraction
    print(f"  wrote timeline.png ({plan.describe()}; bubble {idle:.1%} of the pipelined time)")
    return idle


def sweep_pictures(tmp: Path, docs: Path, quick: bool) -> None:
    scaling = SCALING if not quick else with_option(SCALING, "--gpus", "1024,2048")
    run(scaling + ["--placements", "default"] * quick + ["-o", str(tmp / "scaling")])
    rows = Path(shutil.copy(tmp / "scaling" / "sweep.csv", docs / SCALING_CSV))
    stamp(Path(shutil.copy(tmp / "scaling" / "scaling.png", docs / "img" / "scaling.png")), digest(rows.read_bytes()))
    print("  " + nvlink_gap(rows))
    params = PARAMS if not quick else with_option(PARAMS, "--factors", "0.5,1,2")
    run(params + ["--placements", "default"] * quick + ["-o", str(tmp / "params")])
    rows = Path(shutil.copy(tmp / "params" / "sweep.csv", docs / WHATIF_CSV))
    for name in ("param-hbm_bandwidth.png", "param-nic_bandwidth.png"):
        stamp(Path(shutil.copy(tmp / "params" / name, docs / "img" / name)), digest(rows.read_bytes()))
    print(f"  wrote scaling.png, param-hbm_bandwidth.png, param-nic_bandwidth.png, {SCALING_CSV}, {WHATIF_CSV}")


def nvlink_gaps(path: Path) -> dict[int, tuple[float, float]]:
    """The least and the most MFU points that an NVLink domain of 64 gains over one of 4 among the systems, per GPU
    count (quoted in docs/REPORTS.md)."""
    mfu: dict[tuple[str, int], dict[int, float]] = {}
    with path.open() as f:
        for row in csv.DictReader(f):
            if row["feasible"] == "True":
                mfu.setdefault((row["system"], int(row["gpus"])), {})[int(row["nvlink_domain"])] = float(row["mfu"])
    gaps: dict[int, list[float]] = {}
    for (_, gpus), by_domain in sorted(mfu.items()):
        if 4 in by_domain and 64 in by_domain:
            gaps.setdefault(gpus, []).append(100 * (by_domain[64] - by_domain[4]))
    return {n: (min(g), max(g)) for n, g in sorted(gaps.items())}


def nvlink_gap(path: Path) -> str:
    return "MFU gained by NVLink 64 over 4: " + ", ".join(
        f"{lo:.1f}-{hi:.1f} points at {n} GPUs" for n, (lo, hi) in nvlink_gaps(path).items())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sweep points (smoke test)")
    parser.add_argument("--out", type=Path, default=DOCS, help="folder for img/*.png and the CSVs (default: docs/)")
    parser.add_argument("--only", default=",".join(GROUPS),
                        help=f"comma-separated pictures to make, of {', '.join(GROUPS)} (default: all)")
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    if only - set(GROUPS):
        parser.error(f"--only: {', '.join(sorted(only - set(GROUPS)))} not among {', '.join(GROUPS)}")
    img = args.out / "img"
    img.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        steps = {"report": lambda: report_pictures(Path(tmp), img, args.quick),
                 "serve": lambda: serve_pictures(Path(tmp), img), "plans": lambda: plan_pictures(img),
                 "timeline": lambda: timeline_picture(img),
                 "sweeps": lambda: sweep_pictures(Path(tmp), args.out, args.quick)}
        for name in GROUPS:
            if name in only:
                steps[name]()
    print(f"done in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
