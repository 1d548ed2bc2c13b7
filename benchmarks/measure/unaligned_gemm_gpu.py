"""Unaligned GEMMs measured on a GPU (``Efficiency.unaligned_gemm``): the rate of a bf16 GEMM whose leading
dimension is not a multiple of 16 bytes against its aligned neighbour, in each of a linear layer's three passes, and
the whole training step of GPT-2 (124M) with its vocabulary unpadded (50,257) and padded (50,304), the measurement
benchmarks/measure/unaligned_gemm.py derives the constant from on an A100 (nanoGPT 77e7e04c). Run where a GPU is lent;
writes one dated JSON file that tests/test_gemm_alignment.py reads (no GPU at test time).

    python benchmarks/measure/unaligned_gemm_gpu.py --out data/measured/gpu/<date>-<gpu>-unaligned-gemm.json

Its parts (``--parts``), each written to the file as soon as it is done (a later one that runs out of time leaves
the others):

    gemms   for each (M, K, N): y = x Wᵀ with x [M, K], W [N, K] row-major as torch.nn.Linear holds it, timed as its
            forward (x Wᵀ), input gradient (dy W, the contraction over N) and weight gradient (dyᵀ x), each the
            median of ``reps`` CUDA-event timings after 5 warm-ups; N (the vocabulary) unaligned beside aligned, and an
            unaligned K once. An odd N makes dy's rows (and y's) N elements long: 2N bytes apart, 16-byte aligned only
            when N is a multiple of 8.
    loss    cross-entropy forward + backward over fp32 logits [M, N] for the same vocabularies (the loss kernels lose
            their vector loads on odd rows too).
    eager, compiled
            one training iteration of GPT-2 (12 layers of 768, 1024 tokens, micro-batch 12, bf16 weights, fused AdamW),
            eager and under torch.compile (the whole model, as nanoGPT's bench.py), with vocabulary 50,257 and 50,304:
            wall-clock medians (small_work_gpu._median_pass).
    compiled_linear
            one linear layer's forward and backward at both vocabularies, eager and under torch.compile, with
            Inductor's padding settings (``shape_padding``, on by default since PyTorch 2.1: pytorch/pytorch#101915).
    profile the CUDA kernels of one eager iteration at each vocabulary and one compiled at 50,304 (torch.profiler),
            by name with their launches and summed seconds (benchmarks/measure/breakdown_gpu.py reads them).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import small_work_gpu as sw  # noqa: E402  (its GPT builder, timing and machine description)

# (M tokens, K model width, N vocabulary): GPT-2's 12 x 1024 tokens at each GPT-2 width against 50,257 and 50,304
# (and 50,258 / 50,260 / 50,264: multiples of 2, 4 and 8 elements, 4, 8 and 16 bytes); Llama's 32,000 against 32,001.
SHAPES = [(12288, k, n) for k in (768, 1024, 1600) for n in (50257, 50304)] + [
    (12288, 768, 50258), (12288, 768, 50260), (12288, 768, 50264), (8192, 4096, 32000), (8192, 4096, 32001),
    (8192, 2047, 8192), (8192, 2048, 8192)]
VOCABS = (50257, 50304)


def event_median(torch, fn, reps: int, warmups: int = 5) -> float:
    """Median seconds of ``fn`` over ``reps`` CUDA-event timings after ``warmups`` untimed calls (the timer of the
    device checks in this folder: bias_grad_gemm_gpu.py, sink_attention_gpu.py)."""
    for _ in range(warmups):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return statistics.median(times)


def _linear(torch, m: int, k: int, n: int, reps: int) -> list[dict]:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    passes = {"forward": lambda: torch.nn.functional.linear(x, w), "input_grad": lambda: dy @ w,
              "weight_grad": lambda: dy.t() @ x}
    rows = []
    for name, fn in passes.items():
        seconds = event_median(torch, fn, reps)
        tflops = 2 * m * k * n / seconds / 1e12
        rows.append({"m": m, "k": k, "n": n, "pass": name, "seconds": seconds, "tflops": tflops})
    return rows


def gemms(torch, reps: int) -> list[dict]:
    return [row for m, k, n in SHAPES for row in _linear(torch, m, k, n, reps)]


def _loss(torch, m: int, n: int, reps: int) -> dict:
    logits = torch.randn(m, n, device="cuda", dtype=torch.float32, requires_grad=True)
    labels = torch.randint(0, n, (m,), device="cuda")
    seconds = event_median(torch, lambda: torch.nn.functional.cross_entropy(logits, labels).backward(), reps)
    return {"m": m, "n": n, "seconds": seconds}


def losses(torch, reps: int, m: int = 12288) -> list[dict]:
    return [_loss(torch, m, n, reps) for n in VOCABS + (32000, 32001)]


def _iteration(torch, vocab: int, compiled: bool, batch: int, seq: int):
    """One GPT-2 training iteration (forward, backward, fused AdamW) as a callable, whole-model compiled or eager."""
    sw.HEAD_DIM.setdefault(768, 64)
    torch.manual_seed(0)
    model = sw.gpt(torch, 768, 12, seq, vocab).to("cuda", torch.bfloat16)
    run = torch.compile(model) if compiled else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    tokens = torch.randint(0, vocab, (batch, seq), device="cuda")

    def step():
        run(tokens, tokens).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _step(torch, vocab: int, compiled: bool, reps: int, batch: int, seq: int) -> dict:
    step = _iteration(torch, vocab, compiled, batch, seq)
    start = time.perf_counter()
    step()
    torch.cuda.synchronize()
    first = time.perf_counter() - start
    wall, host = sw._median_pass(torch, step, reps, 3)
    return {"vocab": vocab, "compiled": compiled, "batch": batch, "seq": seq, "wall_s": wall, "host_s": host,
            "first_s": first}


def _compiled_linear(torch, m: int, k: int, n: int, reps: int) -> dict:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    fn = torch.compile(lambda a, b: torch.nn.functional.linear(a, b).sum())
    eager = event_median(torch, lambda: torch.nn.functional.linear(x, w).sum().backward(), reps)
    compiled = event_median(torch, lambda: fn(x, w).backward(), reps)
    return {"m": m, "k": k, "n": n, "eager_s": eager, "compiled_s": compiled}


def compiled_linears(torch, reps: int) -> list[dict]:
    """One linear layer's three GEMMs (forward + backward of a summed output) eager and under torch.compile, whose
    Inductor pads unaligned matmul operands (torch._inductor.config.shape_padding), at GPT-2's vocabularies."""
    import torch._inductor.config as inductor

    rows = [_compiled_linear(torch, 12288, 768, n, reps) for n in VOCABS]
    return [row | {"shape_padding": inductor.shape_padding,
                   "comprehensive_padding": getattr(inductor, "comprehensive_padding", None)} for row in rows]


def _kernels(torch, step) -> list[dict]:
    """One profiled call of ``step`` after warm-up: each CUDA kernel name with its launches and summed seconds."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    table: dict[str, list[float]] = {}
    for evt in prof.events():
        if str(getattr(evt, "device_type", "")).endswith("CUDA"):
            row = table.setdefault(evt.name, [0, 0.0])
            row[0] += 1
            row[1] += evt.time_range.elapsed_us() * 1e-6
    return sorted(({"kernel": k, "launches": n, "seconds": t} for k, (n, t) in table.items()),
                  key=lambda r: -r["seconds"])


def profiles(torch, batch: int = 12, seq: int = 1024) -> list[dict]:
    """The kernels of one GPT-2 training iteration (as ``steps``), eager at both vocabularies and compiled aligned."""
    rows = []
    for vocab, compiled in ((50304, False), (50257, False), (50304, True)):
        rows.append({"vocab": vocab, "compiled": compiled,
                     "kernels": _kernels(torch, _iteration(torch, vocab, compiled, batch, seq))})
        torch.cuda.empty_cache()
    return rows


def steps(torch, compiled: bool, reps: int, batch: int = 12, seq: int = 1024) -> list[dict]:
    rows = []
    for vocab in VOCABS:
        rows.append(_step(torch, vocab, compiled, reps, batch, seq))
        torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--parts", default="gemms,loss,eager,compiled,compiled_linear,profile")
    args = parser.parse_args(argv)
    import torch

    out = {"machine": sw.machine(torch), "method": __doc__.split("\n\n", 2)[2].strip()}
    parts = args.parts.split(",")
    jobs = {"gemms": lambda: gemms(torch, args.reps), "loss": lambda: losses(torch, args.reps),
            "eager": lambda: steps(torch, False, 10), "compiled": lambda: steps(torch, True, 10),
            "compiled_linear": lambda: compiled_linears(torch, args.reps), "profile": lambda: profiles(torch)}
    for part in parts:
        start = time.perf_counter()
        out[part] = jobs[part]()
        print(f"{part}: {time.perf_counter() - start:.1f} s", flush=True)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
