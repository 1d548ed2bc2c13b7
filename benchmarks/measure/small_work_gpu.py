"""The small-work training regime measured on a GPU (issue 46, items 3 and 6): eager PyTorch training steps of small
GPT models, from widths and batches where the host's fixed cost per kernel is the step to where the work is, with
the GPU's own time apart. Run where a GPU is lent; writes one dated JSON file (data/measured/<date>-<gpu>-small-work
.json) that benchmarks/docs/small_work_gpu_doc.py compares with meshplan's estimate (docs/SMALL_WORK_GPU.md).

    python benchmarks/measure/small_work_gpu.py --out data/measured/2026-11-26-nvidia-h200-small-work.json

The model is Megatron-DeepSpeed's GPT written in plain PyTorch (the stack the issue's held-out runs used, less its
fused kernels: eager PyTorch issues one kernel per aten op): learned positions, pre-LayerNorm layers of a fused QKV
Linear with bias, causal scaled_dot_product_attention (FlashAttention on Hopper), the output projection, a 4h GELU
MLP with biases, a final LayerNorm and a tied LM head with cross-entropy; bf16 weights (Megatron's --bf16 module).
For each width h, micro-batch b and depth L (two depths, so that the per-layer time is their difference over the
layers between, free of the embedding and head), three timings of forward + backward:

    eager      wall clock of the whole pass, the median of ``steps`` after ``warmup`` (what a user sees)
    host       the issuing thread's CPU time over the same pass before its final synchronisation (the host's work)
    graphed    the same pass captured once as CUDA graphs (torch.cuda.make_graphed_callables) and replayed: the GPU's
               time with no host between kernels, what the kernels alone take

and one profiled pass (torch.profiler): the kernels launched and the sum of their durations (the GPU busy time).
Per layer per micro-batch, fitted over b as a + s·b (least squares), the issue's own form: s is the work, a the fixed
cost. Besides, the per-kernel floors: 2,000 back-to-back tiny adds issued eagerly (the host's time per launch) and
the same adds replayed from one CUDA graph (the GPU's own time per kernel: launch and ramp), and meshplan
calibrate's dispatch benchmark (calibrate/dispatch.py) on the GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WIDTHS = (1024, 2048)
BATCHES = (1, 2, 4, 8)
DEPTHS = (2, 6)
SEQ = 1024
VOCAB = 50304  # GPT-2's 50,257 padded to a multiple of 128, as Megatron pads it
HEAD_DIM = {1024: 64, 2048: 128}
DEVICE = os.environ.get("SMALL_WORK_DEVICE", "cuda")  # cpu: a smoke test of this script on a machine without a GPU


STACK = {"name": "pytorch"}  # --stack: "pytorch" (gpt below), "compiled" (it under torch.compile), "megatron" or "mds"


def build(torch, width: int, layers: int, seq: int = SEQ):
    """The GPT of ``--stack`` in bf16 on DEVICE."""
    if STACK["name"] == "megatron":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from small_work_megatron import megatron_gpt

        return megatron_gpt(torch, width, layers, width // HEAD_DIM[width], seq, VOCAB, DEVICE)
    if STACK["name"] == "mds":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from small_work_mds import mds_gpt

        return mds_gpt(torch, width, layers, width // HEAD_DIM[width], seq, VOCAB, DEVICE)
    model = gpt(torch, width, layers, seq).to(DEVICE, torch.bfloat16)
    if STACK["name"] == "compiled":  # each block compiled as torchtitan's apply_compile does (torch.compile(block,
        for i, layer in enumerate(model.layers):  # fullgraph=True), Inductor's default mode: fused Triton kernels, each
            model.layers[i] = torch.compile(layer, fullgraph=True)  # launched by the host, no CUDA graphs)
    return model


def _sync(torch) -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def gpt(torch, width: int, layers: int, seq: int = SEQ, vocab: int = VOCAB):
    """Megatron-DeepSpeed's GPT in plain PyTorch (the module docstring)."""
    nn, F = torch.nn, torch.nn.functional
    heads = width // HEAD_DIM[width]

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.fc1, self.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, heads, width // heads).permute(2, 0, 3, 1, 4).unbind(0)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, s, width))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(seq, width)
            self.layers = nn.ModuleList(Layer() for _ in range(layers))
            self.ln_f = nn.LayerNorm(width)

        def forward(self, tokens, labels):
            x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
            for layer in self.layers:
                x = layer(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)
            return F.cross_entropy(logits.float().view(-1, vocab), labels.view(-1))

    return GPT()


def _median_pass(torch, step, steps: int, warmup: int) -> tuple[float, float]:
    """(wall seconds, issuing thread's CPU seconds) per call of ``step``, medians over ``steps`` after ``warmup``."""
    for _ in range(warmup):
        step()
    _sync(torch)
    walls, hosts = [], []
    for _ in range(steps):
        start, cpu = time.perf_counter(), time.thread_time()
        step()
        hosts.append(time.thread_time() - cpu)
        _sync(torch)
        walls.append(time.perf_counter() - start)
    return statistics.median(walls), statistics.median(hosts)


def _profiled(torch, step) -> dict:
    """One pass under torch.profiler: kernels launched and their summed durations."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        _sync(torch)
    kernels, busy, launches = 0, 0.0, 0
    for evt in prof.events():
        kind = str(getattr(evt, "device_type", ""))
        if kind.endswith("CUDA") and getattr(evt, "is_async", False) is False and "Memcpy" not in evt.name \
                and "Memset" not in evt.name:
            kernels += 1
            busy += evt.time_range.elapsed_us() * 1e-6
        elif evt.name in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx"):
            launches += 1
    return {"kernels": kernels, "kernel_busy_s": busy, "launch_calls": launches}


def measure_config(torch, width: int, batch: int, layers: int, steps: int, warmup: int, seq: int = SEQ) -> dict:
    torch.manual_seed(0)
    model = build(torch, width, layers, seq)
    tokens = torch.randint(0, VOCAB, (batch, seq), device=DEVICE)
    labels = torch.randint(0, VOCAB, (batch, seq), device=DEVICE)

    def eager():
        model(tokens, labels).backward()

    wall, host = _median_pass(torch, eager, steps, warmup)
    row = {"stack": STACK["name"], "width": width, "batch": batch, "layers": layers, "seq": seq, "eager_s": wall,
           "host_s": host, **_profiled(torch, eager)}
    if STACK["name"] == "mds":  # the pass again with DeepSpeed's BF16_Optimizer's per-micro-batch work around it
        from small_work_mds import ds_bf16_accumulate

        backward = ds_bf16_accumulate(torch, model)
        row["bf16_accumulate_s"], row["bf16_accumulate_host_s"] = _median_pass(
            torch, lambda: backward(model(tokens, labels)), steps, warmup)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    row["adamw_s"], row["adamw_host_s"] = _median_pass(torch, opt.step, steps, warmup)
    row["params"] = sum(p.numel() for p in model.parameters())
    if DEVICE != "cuda" or STACK["name"] in ("compiled", "mds"):
        row["graphed_error"] = "no CUDA graphs on a CPU" if DEVICE != "cuda" else f"{STACK['name']}: not captured"
        return row
    try:
        graphed = torch.cuda.make_graphed_callables(model, (tokens, labels))
        row["graphed_s"], row["graphed_host_s"] = _median_pass(torch, lambda: graphed(tokens, labels).backward(),
                                                               steps, warmup)
    except Exception as exc:  # noqa: BLE001  recorded, the other timings stand
        row["graphed_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return row


def phase_split(torch, width: int, batch: int, layers: int, steps: int, warmup: int, seq: int = SEQ) -> dict:
    """Forward without autograd, forward recording it, and backward, timed apart (a synchronisation between), and
    the kernels each launches (torch.profiler): where the host's time per kernel goes in training."""
    torch.manual_seed(0)
    model = build(torch, width, layers, seq)
    tokens = torch.randint(0, VOCAB, (batch, seq), device=DEVICE)
    labels = torch.randint(0, VOCAB, (batch, seq), device=DEVICE)
    times: dict[str, list[float]] = {"forward_nograd_s": [], "forward_s": [], "backward_s": []}
    for i in range(warmup + steps):
        _sync(torch)
        start = time.perf_counter()
        with torch.no_grad():
            model(tokens, labels)
        _sync(torch)
        mid = time.perf_counter()
        loss = model(tokens, labels)
        _sync(torch)
        end = time.perf_counter()
        loss.backward()
        _sync(torch)
        if i >= warmup:
            times["forward_nograd_s"].append(mid - start)
            times["forward_s"].append(end - mid)
            times["backward_s"].append(time.perf_counter() - end)
    row = {"stack": STACK["name"], "width": width, "batch": batch, "layers": layers, "seq": seq}
    row |= {k: statistics.median(v) for k, v in times.items()}
    with torch.no_grad():
        row["forward_nograd"] = _profiled(torch, lambda: model(tokens, labels))
    holder: list = []
    row["forward"] = _profiled(torch, lambda: holder.append(model(tokens, labels)))
    row["backward"] = _profiled(torch, lambda: holder.pop().backward())
    return row


def host_costs() -> dict:
    """check-step's host microbenchmarks (measure/host.py) on the GPU's host: per op called from Python, autograd's
    recording, the engine's node, a module call, a torch.ops dispatch."""
    from meshplan.measure.host import measure_host
    from meshplan.measure.timing import make_clock

    return measure_host(make_clock("wall", DEVICE, 1), DEVICE).to_dict()


def kernel_floors(torch, count: int = 2000) -> dict:
    """Per tiny kernel: issued eagerly (the host's time per launch) and replayed from one CUDA graph (the GPU's)."""
    x = torch.ones(256, device="cuda")
    out = torch.empty_like(x)

    def adds():
        for _ in range(count):
            torch.add(x, 1.0, out=out)

    eager, host = _median_pass(torch, adds, 7, 2)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        adds()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        adds()
    replay, _ = _median_pass(torch, graph.replay, 7, 2)
    return {"kernels": count, "eager_per_kernel_s": eager / count, "eager_host_per_kernel_s": host / count,
            "graph_per_kernel_s": replay / count}


def dispatch_fit() -> dict:
    """meshplan calibrate's dispatch benchmark on the GPU (calibrate/dispatch.py) and its fit."""
    from dataclasses import asdict

    from meshplan.calibrate.dispatch import bench_dispatch
    from meshplan.calibrate.fit import fit_dispatch, host_dispatch
    from meshplan.calibrate.settings import settings_for

    samples = bench_dispatch(settings_for("cuda", quick=False), "cuda")
    fits = fit_dispatch(samples)
    found = host_dispatch(fits)
    return {"host_dispatch_s": found.seconds, "module_call_s": found.module, "fits": [asdict(f) for f in fits]}


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def machine(torch) -> dict:
    base = {"date": datetime.date.today().isoformat(), "torch": torch.__version__, "python": platform.python_version(),
            "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()}
    if DEVICE != "cuda":
        return base | {"gpu": "none (CPU smoke test)"}
    props = torch.cuda.get_device_properties(0)
    return base | {"gpu": props.name, "sms": props.multi_processor_count, "memory_bytes": props.total_memory,
                   "cuda": torch.version.cuda, "driver_clock_note": "default clocks (not locked)"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--widths", type=_ints, default=WIDTHS)
    parser.add_argument("--batches", type=_ints, default=BATCHES)
    parser.add_argument("--depths", type=_ints, default=DEPTHS)
    parser.add_argument("--seq", type=int, default=SEQ)
    parser.add_argument("--stack", choices=("pytorch", "compiled", "megatron", "mds"), default="pytorch",
                        help="the model's code: plain PyTorch, it under torch.compile (Inductor, default mode), "
                        "Megatron-Core's GPTModel (small_work_megatron.py) or Megatron-DeepSpeed's (small_work_mds.py)")
    parser.add_argument("--phases", action="store_true", help="only the forward / backward split (batch 1, both "
                        "depths) and the host microbenchmarks")
    args = parser.parse_args(argv)
    STACK["name"] = args.stack
    import torch

    data = machine(torch) | {"rows": []}
    if args.phases:
        data["host_costs"] = host_costs()
        print(json.dumps(data["host_costs"]), flush=True)
        data["phases"] = [phase_split(torch, w, b, d, args.steps, args.warmup, args.seq)
                          for w in args.widths for d in args.depths for b in args.batches]
        Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
        print(json.dumps(data["phases"]), flush=True)
        return 0
    if DEVICE == "cuda" and args.stack == "pytorch":
        data["floors"] = kernel_floors(torch)
        print(json.dumps(data["floors"]), flush=True)
        try:
            data["dispatch"] = dispatch_fit()
            print(f"host_dispatch {data['dispatch']['host_dispatch_s'] * 1e6:.2f} us", flush=True)
        except Exception as exc:  # noqa: BLE001
            data["dispatch_error"] = f"{type(exc).__name__}: {exc}"[:300]
    for width in args.widths:
        for layers in args.depths:
            for batch in args.batches:
                row = measure_config(torch, width, batch, layers, args.steps, args.warmup, args.seq)
                if DEVICE == "cuda":
                    torch.cuda.empty_cache()
                data["rows"].append(row)
                print(json.dumps(row), flush=True)
                Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
