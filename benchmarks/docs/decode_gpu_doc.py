"""docs/DECODE_GPU.md: decode steps of a Llama-2-7B-shaped model measured on a lent H200 against meshplan's serving
estimate (issue 46, items 3 and 4), rendered from the committed data file without a GPU:

    python benchmarks/docs/decode_gpu_doc.py            # writes docs/DECODE_GPU.md

The data: data/measured/gpu/*-decode.json, made by benchmarks/measure/decode_gpu.py (its docstring says what the model
is and what each timing means). meshplan prices the same step on its preset of the GPU: the serving iteration's ops
(serve/iteration.py) for one GPU, tp 1, bf16, the batch's sequences decoding against a context of the cache's length
(the measured step reads every cached position), under the engine preset that a gpt-fast record gets (presets/
engine_versions.toml). The measured compiled step (torch.compile mode "reduce-overhead": Inductor's kernels replayed
from one CUDA graph) is what meshplan's serving model describes: every kernel on the GPU, none waiting on the host.
tests/test_docs.py renders it again and compares; tests/test_decode_gpu.py checks the arithmetic.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

from meshplan.cost.decode import Shape, gemm
from meshplan.cost.kv_cache import token_bytes
from meshplan.roofline import stream_bandwidth
from meshplan.serve.efficiency import SERVE_DEFAULT
from meshplan.serve.engine import load_engine
from meshplan.serve.engine_version import preset_for
from meshplan.serve.iteration import breakdown, extra_kernel_time, layouts, op_kinds, op_seconds, stage_ops
from meshplan.serve.precision import parse_quant
from meshplan.specs.hardware import Cluster, load_system
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_load import load_model

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data" / "measured" / "gpu"
DOC = ROOT / "docs" / "DECODE_GPU.md"
SYSTEM = {"NVIDIA H200": "h200", "NVIDIA H100 80GB HBM3": "h100"}
# L2 bytes as PyTorch reported them on the lent machines (torch.cuda.get_device_properties(0).L2_cache_size,
# .library/device/KINDS.md), for the files that predate decode_gpu.py recording it: a weight that fits is read from L2
# when its GEMM repeats (the GEMM table's runs)
L2_BYTES = {"NVIDIA H200": 60e6, "NVIDIA H100 80GB HBM3": 50e6}
MODELS = {4096: "llama2-7b", 8192: "llama2-70b"}  # the measured shapes (decode_gpu.SHAPES) by width
ENGINE = "gpt-fast (PyTorch, torch.compile mode='reduce-overhead', CUDA graphs)"  # the small-work records' string
LAYER_OPS = ("attn/", "mlp/")  # op names of a layer (serve/ops.py); the rest are the embedding and the head


def files() -> list[Path]:
    """The newest decode file of each GPU (data/measured/gpu/<date>-<gpu>-decode.json), by GPU name."""
    newest = {path.name.split("-", 3)[-1]: path for path in sorted(DATA.glob("*-decode.json"))}
    return [newest[k] for k in sorted(newest)]


def of_gpu(gpu: str) -> Path:
    """The newest decode file of a GPU ("h200")."""
    return next(path for path in files() if f"-{gpu}-" in path.name)


def calls(path: Path) -> list[dict]:
    return json.loads(path.read_text())["calls"]


def rows(path: Path) -> dict[tuple[int, int], dict]:
    """Each (batch, cache) decode row of every call, later calls' fields over earlier ones'."""
    out: dict[tuple[int, int], dict] = {}
    for call in calls(path):
        for row in call["rows"]:
            out.setdefault((row["batch"], row["cache"]), {}).update(row)
    return out


def cluster_of(path: Path) -> Cluster:
    return load_system(SYSTEM[calls(path)[0]["machine"]["gpu"]]).cluster(1)


def _shape(batch: int, cache: int) -> Shape:
    """One GPU decoding ``batch`` sequences at ``cache`` tokens of context, bf16 throughout."""
    q = parse_quant("bf16")
    return Shape(tp=1, dpa=1, ep=1, decode=float(batch), context=float(cache), prefill=0.0, prompts=0.0, prefix=0.0,
                 w_bytes=q.weight_bytes, a_bytes=q.act_bytes, kv_bytes=q.kv_bytes)


def predicted(model: ModelSpec, cluster: Cluster, batch: int, cache: int) -> dict[str, float]:
    """meshplan's decode step for ``batch`` sequences at ``cache`` tokens of context: seconds by op name, the
    engine's host time per iteration (``engine/host``) and its kernels beyond the op list's (``engine/kernels``)
    where its preset has them."""
    q = parse_quant("bf16")
    sh = _shape(batch, cache)
    parts = breakdown(model, cluster, sh, 1, q, SERVE_DEFAULT)
    engine = load_engine(preset_for(ENGINE) or "generic")
    host = float(engine.host_time(batch, 1, cluster.python_host))
    extra = float(extra_kernel_time(model, cluster, sh, engine))
    return parts | ({"engine/host": host} if host else {}) | ({"engine/kernels": extra} if extra else {})


def by_kind(model: ModelSpec, parts: dict[str, float], batch: int, cache: int) -> dict[str, float]:
    """Seconds per layer by kind (gemm, attention, memory) of the layer's ops alone."""
    kinds = op_kinds(model, _shape(batch, cache), 1)
    out: dict[str, float] = {}
    for name, seconds in parts.items():
        if name.startswith(LAYER_OPS) and seconds:
            out[kinds[name]] = out.get(kinds[name], 0.0) + seconds / model.num_layers
    out["memory"] = out.get("memory", 0.0) + parts.get("engine/kernels", 0.0) / model.num_layers
    return out


def kernel_classes(kernels: list[dict]) -> dict[str, tuple[int, float]]:
    """The profiled kernels of one step by class: (count, summed seconds) of the GEMMs (cuBLAS's nvjet kernels), their
    split-K reductions (cuBLAS's ``splitKreduce_kernel``), the attention kernel, and the rest (Inductor's Triton
    kernels, PyTorch's)."""
    out = {"gemm": [0, 0.0], "reduce": [0, 0.0], "attention": [0, 0.0], "other": [0, 0.0]}
    for k in kernels:
        name = k["name"].lower()
        cls = ("attention" if "sdpa" in name or "flash" in name or "attention_kernel" in name
               else "reduce" if "splitkreduce" in name else "gemm" if "nvjet" in name or "gemm" in name else "other")
        if cls == "attention" and name.startswith("triton"):  # a Triton kernel Inductor fused around the call
            cls = "other"
        out[cls][0] += k["count"]
        out[cls][1] += k["us"] * 1e-6
    return {c: (int(n), float(s)) for c, (n, s) in out.items()}


def fixed_costs(path: Path) -> dict[int, dict[str, float]]:
    """Per profiled compiled step (by batch), the fixed seconds of a kernel, each with the graph's mean gap between
    kernels (``gap``: the step's wall time less its kernels' summed durations, over the kernels): a GEMM kernel's
    (``gemm``: the GEMM kernels' durations less the weights' and activations' bytes at the preset's streaming rate,
    roofline.stream_bandwidth, over their count), any other kernel's (``other``: Inductor's, PyTorch's and the
    split-K reductions', whose work is a few KB: their whole duration) and the attention kernel's (``attention``:
    less the KV cache's bytes at that rate). The GEMMs' bytes are those of meshplan's own decode ops
    (serve/iteration.stage_ops), the cache's cost/kv_cache.token_bytes for every position, for Llama-2-7B's shape
    (decode_gpu.SHAPES)."""
    model = load_model("llama2-7b")
    rate = float(stream_bandwidth(cluster_of(path).accelerator, SERVE_DEFAULT))
    out = {}
    for (b, c), row in sorted(rows(path).items()):
        if "compiled_kernels" not in row:
            continue
        cls = kernel_classes(row["compiled_kernels"])
        count = sum(n for n, _ in cls.values())
        gap = (row["compiled_s"] - sum(t for _, t in cls.values())) / count
        ops = stage_ops(model, _shape(b, c), 1)
        gemm_bytes = sum(float(op.nbytes) * n for op, n in ops if op.kind == "gemm")
        kv_bytes = b * c * float(token_bytes(model, 2))  # every cached position's keys and values, 16-bit
        small = (cls["other"][0] + cls["reduce"][0], cls["other"][1] + cls["reduce"][1])
        out[b] = {"gap": gap, "gemm": (cls["gemm"][1] - gemm_bytes / rate) / cls["gemm"][0] + gap,
                  "other": small[1] / small[0] + gap,
                  "attention": (cls["attention"][1] - kv_bytes / rate) / cls["attention"][0] + gap}
    return out


def preset_fixed_costs() -> dict[str, float]:
    """The per-kernel fixed times the presets hold (hardware/h100.toml): the mean over every profiled compiled step
    (each GPU's newest file) of ``fixed_costs``' other kernel (``kernel_overhead``) and GEMM kernel
    (``gemm_overhead``), each rounded to 0.1 µs."""
    steps = [x for path in files() for x in fixed_costs(path).values()]
    return {"kernel_overhead": round(statistics.fmean(x["other"] for x in steps) * 1e7) / 1e7,
            "gemm_overhead": round(statistics.fmean(x["gemm"] for x in steps) * 1e7) / 1e7}


def gemm_rows(path: Path, cluster: Cluster) -> list[dict]:
    """Each measured weight GEMM beside meshplan's time for it (serve's decode GEMM at the batch's rows)."""
    q = parse_quant("bf16")
    out = []
    for call in calls(path):
        for g in call["gemms"]:
            op = gemm("g", g["m"], g["k"], g["n"], q.weight_bytes, q.act_bytes)
            mine = float(op_seconds(op, cluster, q, SERVE_DEFAULT, layouts(1, 1, 1)))
            l2 = call["machine"].get("l2_bytes") or L2_BYTES[call["machine"]["gpu"]]  # recorded since these files
            cached = g["n"] * g["k"] * q.weight_bytes < l2
            out.append(g | {"model": MODELS[call["shape"]["hidden"]], "predicted_s": mine, "in_l2": cached})
    return out


def _grouped(table: list[dict]) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = {}
    for g in table:
        out.setdefault((g["model"], g["gemm"], g["n"], g["k"], g["m"]), []).append(g)
    return out


def one_row(table: list[dict]) -> list[dict]:
    """Each GEMM measured at one row: its bytes and the median of its times over the calls."""
    return [{"bytes": group[0]["bytes"], "s": statistics.median(g["s"] for g in group)}
            for key, group in _grouped(table).items() if key[4] == 1]


def line_fit(points: list[dict]) -> tuple[float, float]:
    """Least squares of t = t0 + bytes / B over the GEMMs: (t0 seconds, B bytes per second)."""
    a = np.array([[1.0, p["bytes"]] for p in points])
    (t0, inv), *_ = np.linalg.lstsq(a, np.array([p["s"] for p in points]), rcond=None)
    return float(t0), float(1.0 / inv)


def _count(kernels: list[dict]) -> int:
    return sum(k["count"] for k in kernels)


def _err(pred: float, meas: float) -> str:
    return f"{pred / meas - 1:+.0%}"


def header() -> str:
    sources = ", ".join(str(path.relative_to(ROOT)) for path in files())
    return "\n".join([
        "# Decode steps measured on a GPU", "",
        f"<!-- generated by benchmarks/docs/decode_gpu_doc.py from {sources}; do not edit -->", "",
        "A Llama-2-7B-shaped decoder (32 layers of width 4,096, bf16, random weights; "
        "benchmarks/measure/decode_gpu.py, written from gpt-fast's structure) decoding one token per sequence on one "
        "GPU. Each step reads the whole static KV cache (its length is the context). meshplan prices the same step on "
        "its preset of the GPU under the engine preset a gpt-fast record gets "
        f"(`{preset_for(ENGINE) or 'generic'}`).", "",
        "- **eager**: PyTorch issues every kernel from Python; *host* is the issuing thread's CPU time.",
        "- **graph**: the same eager kernels captured once as a CUDA graph and replayed: the GPU alone.",
        "- **compiled**: `torch.compile(mode=\"reduce-overhead\", fullgraph=True)`, gpt-fast's decode step: "
        "Inductor's fused kernels replayed from one CUDA graph. This is what meshplan's serving model describes.", "",
        ""])


def render(path: Path) -> str:
    cluster = cluster_of(path)
    model = load_model("llama2-7b")
    first = calls(path)[0]
    m = first["machine"]
    lines = [f"## {m['gpu']}", "",
             f"PyTorch {m['torch']}, CUDA {m['cuda']}, {m['cores']} host cores, clocks not locked, {m['date']} "
             f"(`{path.relative_to(ROOT)}`); meshplan's `{SYSTEM[m['gpu']]}` preset.",
             "", "### The step", "",
             "| batch | context | eager ms | host ms | graph ms | compiled ms | meshplan ms | meshplan vs compiled |"
             " meshplan vs graph |", "|---|---|---|---|---|---|---|---|---|"]
    for (b, c), row in sorted(rows(path).items(), key=lambda kv: (kv[0][1], kv[0][0])):
        pred = sum(predicted(model, cluster, b, c).values())
        comp = row.get("compiled_s")
        lines.append(f"| {b} | {c} | {row['eager_s'] * 1e3:.2f} | {row['eager_host_s'] * 1e3:.2f} | "
                     f"{row['graph_s'] * 1e3:.2f} | {comp * 1e3:.2f} | " if comp else
                     f"| {b} | {c} | {row['eager_s'] * 1e3:.2f} | {row['eager_host_s'] * 1e3:.2f} | "
                     f"{row['graph_s'] * 1e3:.2f} | – | ")
        lines[-1] += (f"{pred * 1e3:.2f} | {_err(pred, comp) if comp else '–'} | {_err(pred, row['graph_s'])} |")
    lines += ["", "A minus sign: meshplan reads faster than measured.", "",
              "### Where a compiled layer's time goes", "",
              "One compiled step profiled (torch.profiler; the kernels replayed from the graph), per layer: the "
              "kernels by class and the graph's gaps between them (the step's wall time less its kernels' summed "
              "durations), against meshplan's ops of a layer by kind (each op one kernel of the accelerator's "
              "fixed time plus its work; *other* holds the engine preset's kernels beyond the op list's, "
              "`decode_layer_kernels`).", "",
              "| batch | kernels / layer | GEMMs µs (kernels) | attention µs | other µs (kernels) | gaps µs | "
              "layer µs | meshplan: GEMMs µs | attention µs | other µs | layer µs |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (b, c), row in sorted(rows(path).items()):
        if "compiled_kernels" not in row:
            continue
        cls = kernel_classes(row["compiled_kernels"])
        count = sum(n for n, _ in cls.values())
        busy = sum(s for _, s in cls.values())
        gaps = row["compiled_s"] - busy
        per = model.num_layers
        mine = by_kind(model, predicted(model, cluster, b, c), b, c)
        layer = row["compiled_s"] / per
        gemms = (cls["gemm"][0] + cls["reduce"][0], cls["gemm"][1] + cls["reduce"][1])  # split-K's reductions in
        lines.append(f"| {b} | {count / per:.1f} | {gemms[1] / per * 1e6:.1f} ({gemms[0] / per:.1f}) | "
                     f"{cls['attention'][1] / per * 1e6:.1f} | {cls['other'][1] / per * 1e6:.1f} "
                     f"({cls['other'][0] / per:.1f}) | {gaps / per * 1e6:.1f} | {layer * 1e6:.1f} | "
                     f"{mine.get('gemm', 0) * 1e6:.1f} | {mine.get('attention', 0) * 1e6:.1f} | "
                     f"{mine.get('memory', 0) * 1e6:.1f} | {sum(mine.values()) * 1e6:.1f} |")
    acc = cluster.accelerator
    lines += ["", "The measured layer's column is the whole step over its layers (the head and the embedding in it); "
              "meshplan's is its layer ops alone.", "",
              "Each kernel's fixed time, its share of the graph's gaps included (`fixed_costs`): an Inductor or "
              "PyTorch kernel's whole duration (a few KB of work), a GEMM kernel's duration less its bytes at the "
              "preset's streaming rate, the attention kernel's less the cache's bytes. The preset's `kernel_overhead` "
              f"is {acc.kernel_overhead * 1e6:.1f} µs and its `gemm_overhead` {acc.gemm_overhead * 1e6:.1f} µs "
              "(attention kernels pay it too).", "",
              "| batch | graph gap µs | other kernel µs | GEMM kernel µs | attention kernel µs |",
              "|---|---|---|---|---|"]
    for b, fixed in fixed_costs(path).items():
        lines.append(f"| {b} | {fixed['gap'] * 1e6:.2f} | {fixed['other'] * 1e6:.2f} | {fixed['gemm'] * 1e6:.2f} | "
                     f"{fixed['attention'] * 1e6:.2f} |")
    lines += ["", "### The weight GEMMs alone", "",
              "Each weight matrix of a layer and the LM head at m rows, 20 in a row replayed from a CUDA graph: time "
              "per GEMM (the median over the calls that measured it), and the rate at which it read its bytes (weights "
              "and activations), against meshplan's decode "
              f"GEMM. The same call's device copy moved {first['copy']['bytes_per_s'] / 1e12:.2f} TB/s (bytes read "
              "and written).", "",
              "| model | GEMM | n × k | m | measured µs (calls) | TB/s | meshplan µs | meshplan vs measured |",
              "|---|---|---|---|---|---|---|---|"]
    table = gemm_rows(path, cluster)
    for (model_name, name, n, k, rows_), group in _grouped(table).items():
        meas = statistics.median(g["s"] for g in group)
        rate = statistics.median(g["bytes_per_s"] for g in group)
        pred = group[0]["predicted_s"]
        mark = " †" if group[0]["in_l2"] else ""
        lines.append(f"| {model_name} | {name}{mark} | {n:,} × {k:,} | {rows_} | {meas * 1e6:.1f} ({len(group)}) | "
                     f"{rate / 1e12:.2f} | {pred * 1e6:.1f} | {_err(pred, meas)} |")
    table = [g for g in table if not g["in_l2"]]
    ones = one_row(table)
    t0, rate = line_fit(ones)
    errs = [abs(g["predicted_s"] / g["s"] - 1) for g in table]
    lines += ["", "† The weight fits in the GPU's L2 cache, so its repeats may read it from there (in a step, each "
              "GEMM reads a weight of its own from HBM): left out below.", "",
              f"At one row, least squares of t = t0 + bytes / B over the {len(ones)} other GEMMs gives t0 = "
              f"{t0 * 1e6:.1f} µs and B = {rate / 1e12:.2f} TB/s; meshplan's GEMMs are "
              f"{statistics.median(errs):.0%} from the measured ones at the median, {max(errs):.0%} at most (at every "
              "row).", "",
              "### The host of an eager step", ""]
    eager = [(b, c, row) for (b, c), row in sorted(rows(path).items())]
    lines += ["| batch | context | kernels / step | host ms / step | host µs / kernel | host ms / layer |",
              "|---|---|---|---|---|---|"]
    for b, c, row in eager:
        n = sum(k["count"] for k in row["kernels"])
        lines.append(f"| {b} | {c} | {n} | {row['eager_host_s'] * 1e3:.2f} | {row['eager_host_s'] / n * 1e6:.1f} | "
                     f"{row['eager_host_s'] / model.num_layers * 1e3:.2f} |")
    per_kernel = statistics.median(row["eager_host_s"] / sum(k["count"] for k in row["kernels"]) for _, _, row in eager)
    per_layer = statistics.median(sum(k["count"] for k in row["kernels"]) for _, _, row in eager) / model.num_layers
    v05 = load_engine("vllm-v0.5")
    lines += ["", f"Eager, the host sets the pace at every batch (the wall time is the host's): {per_kernel * 1e6:.1f} "
              "µs of host time per kernel at the median, inside the 11.3-17.7 µs per eager PyTorch op that the "
              f"`vllm-v0.5` engine preset cites for its eager layers ({v05.eager_layer_overhead * 1e3:.2f} ms for a "
              "fused layer of about 10 kernels, "
              f"{(v05.eager_layer_overhead + v05.eager_layer_tp_overhead) * 1e3:.2f} ms with its two all-reduces "
              "under TP). This unfused layer launches about "
              f"{per_layer:.0f}."]
    bullets = [f"- batch {b}: Inductor's {_count(row['inductor_kernels'])} kernels launched one by one "
               f"(torch.compile's default mode, no CUDA graphs) took {row['inductor_s'] * 1e3:.2f} ms a step, "
               f"{row['inductor_s'] / _count(row['inductor_kernels']) * 1e6:.1f} µs a kernel, against "
               f"{row['compiled_s'] * 1e3:.2f} ms replayed from the graph."
               for (b, _), row in sorted(rows(path).items()) if "inductor_s" in row]
    lines += ["", *bullets, ""] if bullets else [""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--doc", type=Path, default=DOC)
    args = ap.parse_args(argv)
    args.doc.write_text(header() + "\n".join(render(path) for path in files()))
    print(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
