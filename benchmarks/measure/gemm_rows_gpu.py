"""GEMM time against its row count, measured on a GPU (issue 46: a GEMM's kernel choice, split-K and its reduction,
at the row counts where decode and small-model training run). Run where a GPU is lent; writes one dated JSON file.

    python benchmarks/measure/gemm_rows_gpu.py --out data/measured/gpu/<date>-nvidia-h200-gemm-rows.json

Three sets, each GEMM a bf16 ``torch.nn.functional.linear`` (cuBLAS / cuBLASLt's own heuristic picks the kernel):

    decode    the weight GEMMs of Llama 3 8B (QKV 6,144 × 4,096, output 4,096 × 4,096, gate-up 28,672 × 4,096, down
              4,096 × 14,336, LM head 128,256 × 4,096) and of one GPU's shard of Llama 3 70B at tensor parallelism 8
              (QKV 1,280 × 8,192, output 8,192 × 1,024, gate-up 7,168 × 8,192, down 8,192 × 3,584), at every row
              count m from 1 to 64, then every 8th to 256 and every 32nd to 512. The weights are held in enough
              copies (``--l2-multiple`` times the GPU's L2 cache together) that each GEMM of a run reads its weight
              from HBM, as a model's successive layers do.
    training  a linear layer's three GEMMs (forward m = tokens, n = out, k = in; input gradient n = in, k = out;
              weight gradient m = out, n = in, k = tokens) for small models' layer shapes at 2,048-8,192 tokens:
              the shapes where few output tiles tempt a kernel to split its reduction.
    fp8       the decode shapes at some row counts as ``torch._scaled_mm`` with per-tensor scales (the FP8 path
              vLLM's Fp8LinearOp takes on Hopper); a row count the call refuses is recorded with its error.

Each time is a median over runs of 20 GEMMs replayed from one CUDA graph (decode_gpu's timing: no host between
kernels). At the row counts of ``--profile-rows`` (and every training GEMM) one GEMM runs under torch.profiler and
its kernels are recorded by name: a split-K kernel shows ``splitK`` in its name and is followed by a
``splitKreduce_kernel`` (the reduction meshplan charges one kernel's fixed cost for, specs/gemm_shape.py).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decode_gpu  # noqa: E402  (the same folder: graph replay, run timing, the profiler's kernels, the machine)

DECODE = {"llama3-8b": {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
                        "head": (128256, 4096)},
          "llama3-70b-tp8": {"qkv": (1280, 8192), "o": (8192, 1024), "gate_up": (7168, 8192), "down": (8192, 3584)}}
ROWS = tuple(range(1, 65)) + tuple(range(72, 257, 8)) + tuple(range(288, 513, 32))
PROFILE_ROWS = (1, 8, 16, 17, 24, 32, 33, 48, 64, 65, 128, 129, 256)
FP8_ROWS = (1, 8, 16, 17, 32, 33, 64, 128, 256)
TRAIN_LAYERS = ((512, 512), (2048, 512), (512, 2048), (1024, 1024), (4096, 1024), (1024, 4096), (1536, 1536),
                (6144, 1536), (1536, 6144), (2048, 2048), (8192, 2048), (2048, 8192))  # (out, in) of a linear
TRAIN_TOKENS = (2048, 4096, 8192)
REPEAT = 20  # GEMMs per captured run


def _dtype(torch):
    return torch.bfloat16 if decode_gpu.DEVICE == "cuda" else torch.float32


def _l2(torch) -> int:
    return torch.cuda.get_device_properties(0).L2_cache_size if decode_gpu.DEVICE == "cuda" else 1 << 20


def _copies(torch, nbytes: int, multiple: float) -> int:
    """Weight copies whose bytes together pass ``multiple`` × L2 (at least one, at most 64)."""
    return max(1, min(64, math.ceil(multiple * _l2(torch) / nbytes)))


def _time(torch, fn, steps: int) -> float:
    """Seconds per GEMM: ``REPEAT`` calls of ``fn(i)`` captured as one graph, timed as decode_gpu times a run."""
    with torch.no_grad():
        replay = decode_gpu._graph(torch, lambda: [fn(i) for i in range(REPEAT)])
        return decode_gpu._run_of(torch, replay, 5, steps, 3) / REPEAT


def _kernels(torch, fn) -> list[dict]:
    with torch.no_grad():
        fn(0)
        return decode_gpu.kernels(torch, lambda: fn(0))


def decode_rows(torch, rows: tuple[int, ...], profile_rows: tuple[int, ...], steps: int, multiple: float) -> list:
    F = torch.nn.functional
    out = []
    for model, mats in DECODE.items():
        for name, (n, k) in mats.items():
            if decode_gpu.DEVICE != "cuda":
                n, k = max(16, n // 64), max(16, k // 64)
            dt = _dtype(torch)
            copies = _copies(torch, n * k * 2, multiple)
            weights = [torch.randn(n, k, device=decode_gpu.DEVICE, dtype=dt) for _ in range(copies)]
            for m in rows:
                x = torch.randn(m, k, device=decode_gpu.DEVICE, dtype=dt)

                def gemm(i, x=x, w=weights, c=copies):
                    return F.linear(x, w[i % c])
                row = {"model": model, "gemm": name, "m": m, "n": n, "k": k, "copies": copies,
                       "s": _time(torch, gemm, steps)}
                if m in profile_rows:
                    row["kernels"] = _kernels(torch, gemm)
                out.append(row)
            print(f"decode {model} {name}: {len(rows)} row counts", flush=True)
            del weights
    return out


def training_rows(torch, layers, tokens: tuple[int, ...], steps: int) -> list:
    dt, dev = _dtype(torch), decode_gpu.DEVICE
    out = []
    shrink = 1 if dev == "cuda" else 32  # a CPU smoke test: narrower shapes
    for n_out, n_in in ((o // shrink, i // shrink) for o, i in layers):
        for t in (t // shrink for t in tokens):
            for gemm, (m, n, k) in {"fwd": (t, n_out, n_in), "dgrad": (t, n_in, n_out),
                                    "wgrad": (n_out, n_in, t)}.items():
                a = [torch.randn(m, k, device=dev, dtype=dt) for _ in range(2)]
                b = [torch.randn(k, n, device=dev, dtype=dt) for _ in range(2)]

                def mm(i, a=a, b=b):
                    return torch.mm(a[i % 2], b[i % 2])
                out.append({"layer": [n_out, n_in], "tokens": t, "gemm": gemm, "m": m, "n": n, "k": k,
                            "s": _time(torch, mm, steps), "kernels": _kernels(torch, mm)})
        print(f"training {n_out * shrink}x{n_in * shrink}: done", flush=True)
    return out


def fp8_rows(torch, rows: tuple[int, ...], steps: int, multiple: float) -> list:
    dev = decode_gpu.DEVICE
    if dev != "cuda":
        return []
    out = []
    one = torch.ones((), device=dev, dtype=torch.float32)
    for model, mats in DECODE.items():
        for name, (n, k) in mats.items():
            copies = _copies(torch, n * k, multiple)
            weights = [torch.randn(n, k, device=dev).to(torch.float8_e4m3fn) for _ in range(copies)]
            for m in rows:
                x = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)

                def gemm(i, x=x, w=weights, c=copies):
                    return torch._scaled_mm(x, w[i % c].t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
                row = {"model": model, "gemm": name, "m": m, "n": n, "k": k, "copies": copies}
                try:
                    row["s"] = _time(torch, gemm, steps)
                    row["kernels"] = _kernels(torch, gemm)
                except RuntimeError as err:  # a shape the call refuses
                    row["error"] = str(err).splitlines()[0][:300]
                out.append(row)
            del weights
        print(f"fp8 {model}: done", flush=True)
    return out


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rows", type=_ints, default=ROWS)
    ap.add_argument("--profile-rows", type=_ints, default=PROFILE_ROWS)
    ap.add_argument("--fp8-rows", type=_ints, default=FP8_ROWS)
    ap.add_argument("--tokens", type=_ints, default=TRAIN_TOKENS)
    ap.add_argument("--sets", default="decode,training,fp8")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--l2-multiple", type=float, default=3.0)
    args = ap.parse_args(argv)
    import torch

    result = {"machine": decode_gpu.machine(torch), "args": " ".join(argv if argv is not None else sys.argv[1:]),
              "repeat": REPEAT, "decode": [], "training": [], "fp8": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    for name in args.sets.split(","):
        if name == "decode":
            result["decode"] = decode_rows(torch, args.rows, args.profile_rows, args.steps, args.l2_multiple)
        elif name == "training":
            result["training"] = training_rows(torch, TRAIN_LAYERS, args.tokens, args.steps)
        elif name == "fp8":
            result["fp8"] = fp8_rows(torch, args.fp8_rows, args.steps, args.l2_multiple)
        result[f"{name}_wall_s"] = round(time.perf_counter() - start, 1)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        if decode_gpu.DEVICE == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
