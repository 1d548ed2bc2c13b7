"""The host's work per transformer layer of three codes, measured on this CPU (issue 46, item 3: "the host side of
dispatch is CPU work ... measured on the machine at hand"): Megatron-DeepSpeed's own ParallelTransformerLayer, the
stack of the issue's held-out small-work runs; Megatron-Core 0.16.1's local-spec TransformerLayer, whose per-kernel
host time a lent H200 measured (data/measured/gpu/2026-11-26-nvidia-h200-small-work-megatron.json, the preset's
50 µs); and benchmarks/measure/small_work_gpu.py's plain-PyTorch layer, whose per-kernel host time the ``pytorch-fsdp``
preset holds (25 µs). Each layer runs forward and backward on CPU tensors so small (width 64, 16 tokens) that each
aten op is its dispatch and the Python around it: the CPU analogue of a host-bound GPU step. Besides the wall
clock per layer, the Python function calls (``sys.setprofile``) and the aten ops (a TorchDispatchMode) per layer.

So the preset's claim that Megatron-DeepSpeed's layer costs its host what Megatron-Core's does is a measurement here,
not an assumption: tests/test_small_work_gpu.py derives Megatron-DeepSpeed's host seconds per kernel from the
committed file (its layer's time over the plain layer's, times the plain layer's measured per-kernel cost, over the
kernels each launches on a GPU) and holds the ``megatron-deepspeed`` preset to it.

Megatron-DeepSpeed is not on PyPI. Run with a checkout of microsoft/Megatron-DeepSpeed (f4157bea) and DeepSpeed
installed beside it (pure Python, no ops built):

    DS_BUILD_OPS=0 pip install --target /tmp/ds deepspeed==0.19.8 six --no-deps
    python benchmarks/measure/megatron_host_cpu.py --mds /path/to/Megatron-DeepSpeed --ds /tmp/ds \\
        --out data/measured/2026-11-26-megatron-host-cpu.json

With ``--tp N`` it runs Megatron-DeepSpeed's layer alone, at tp 1 and at tp N (N processes, a gloo group), and
records what tensor parallelism adds to the host's work per layer: the Python calls and the aten ops by name of rank
0 (data/measured/2026-11-27-megatron-host-cpu-tp.json; tests/test_small_work_gpu.py holds meshplan's count to it).

On a CPU the CUDA-only paths are bypassed as benchmarks/measure/small_work_megatron.py bypasses them (the CUDA RNG
tracker's fork: dropout is 0); Megatron-DeepSpeed's fused LayerNorm is torch's on a CPU (its transformer.py picks it by
device), its masked softmax takes its torch path, and gradient-accumulation fusion (an apex kernel) is off. Both
Megatron layers run their default fusion flags but Megatron-Core's, which run off as on the H200 (the preset's
measurement).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
WIDTH, HEADS, TOKENS, LAYERS = 64, 2, 16, 4
CODES = ("pytorch", "mcore", "mds")


def _layers(torch, code: str, tp: int = 1, rank: int = 0):
    """``LAYERS`` layers of ``code`` and the call that runs one through a hidden state (Megatron-DeepSpeed's at tensor
    parallelism ``tp``, as rank ``rank`` of a gloo group)."""
    if code == "pytorch":
        sys.path.insert(0, str(HERE))
        import small_work_gpu as sw

        sw.HEAD_DIM[WIDTH], sw.DEVICE = WIDTH // HEADS, "cpu"
        return sw.gpt(torch, WIDTH, LAYERS, TOKENS, vocab=128).layers, (1, TOKENS, WIDTH), lambda layer, h, m: layer(h)
    if code == "mcore":
        sys.path.insert(0, str(HERE))
        from small_work_megatron import _init

        _init(torch, "cpu")
        import torch.nn.functional as F
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.transformer.transformer_block import TransformerBlock
        from megatron.core.transformer.transformer_config import TransformerConfig

        config = TransformerConfig(
            num_layers=LAYERS, hidden_size=WIDTH, num_attention_heads=HEADS, ffn_hidden_size=4 * WIDTH,
            hidden_dropout=0.0, attention_dropout=0.0, add_bias_linear=True, gated_linear_unit=False,
            activation_func=F.gelu, normalization="LayerNorm", bias_activation_fusion=False,
            bias_dropout_fusion=False, masked_softmax_fusion=False, apply_rope_fusion=False,
            gradient_accumulation_fusion=False, use_cpu_initialization=True)
        block = TransformerBlock(config, get_gpt_layer_local_spec())
        return block.layers, (TOKENS, 1, WIDTH), lambda layer, h, m: layer(h, attention_mask=m)
    return _mds_layers(torch, tp, rank)


def _mds_layers(torch, tp: int = 1, rank: int = 0):
    """Megatron-DeepSpeed's layers, its arguments parsed as its pretrain_gpt.py parses them; at ``tp`` > 1 its
    tensor-parallel layers over a gloo group of ``tp`` processes (rendezvous: MASTER_PORT)."""
    import torch.distributed as dist

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    sys.argv = ["pretrain_gpt.py", "--num-layers", str(LAYERS), "--hidden-size", str(WIDTH),
                "--num-attention-heads", str(HEADS), "--seq-length", str(TOKENS),
                "--max-position-embeddings", str(TOKENS), "--micro-batch-size", "1", "--global-batch-size", str(tp),
                "--hidden-dropout", "0", "--attention-dropout", "0", "--no-gradient-accumulation-fusion",
                "--use-cpu-initialization", "--tensor-model-parallel-size", str(tp)]
    from megatron import global_vars
    from megatron.arguments import core_transformer_config_from_args, parse_args, validate_args

    os.environ["WORLD_SIZE"] = str(tp)
    args = parse_args()
    os.environ.setdefault("MASTER_PORT", "29583")
    os.environ.update(MASTER_ADDR="127.0.0.1")
    dist.init_process_group("gloo", rank=rank, world_size=tp)
    with contextlib.redirect_stdout(sys.stderr):
        validate_args(args)
    global_vars.set_args(args)
    import megatron.core.tensor_parallel.random as mr
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(tp, 1)
    mr.CudaRNGStatesTracker.fork = lambda self, name=None: contextlib.nullcontext()
    from megatron.model.transformer import ParallelTransformerLayer

    config = core_transformer_config_from_args(args)
    layers = torch.nn.ModuleList(ParallelTransformerLayer(config, i + 1) for i in range(LAYERS))

    return layers, (TOKENS, 1, WIDTH), lambda layer, h, m: layer(h, m)


def measure(code: str, repeats: int, tp: int = 1, rank: int = 0) -> dict:
    """One code's layers: Python calls, aten ops (also by name) and wall seconds per layer of forward + backward."""
    import torch

    layers, shape, run = _layers(torch, code, tp, rank)
    mask = torch.ones(1, 1, TOKENS, TOKENS, dtype=torch.bool).triu(1)

    def step() -> None:
        h = torch.randn(*shape, requires_grad=True)
        for layer in layers:
            h = run(layer, h, mask)
            h = h[0] if isinstance(h, tuple) else h  # Megatron's layers return (hidden, context) or (hidden, loss)
        h.float().sum().backward()

    found = host_work(step, repeats, LAYERS)
    return {"python_calls": found["python_calls"], "aten_ops": found["aten_ops"],
            "ms_per_layer": found["wall_ms_per_layer"], "ops_by_name": found["ops_by_name"]}


def host_work(step: Callable[[], None], repeats: int, layers: int) -> dict:
    """What one ``step`` (forward + backward of ``layers`` layers) does on the host, per layer: Python calls
    (sys.setprofile), aten ops, also by name (a TorchDispatchMode), and the median wall and thread-CPU milliseconds
    of ``repeats`` timed steps, after five untimed ones."""
    import collections

    from torch.utils._python_dispatch import TorchDispatchMode

    names: collections.Counter = collections.Counter()

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.ops += 1
            names[str(func)] += 1
            return func(*args, **(kwargs or {}))

    for _ in range(5):
        step()
    calls = [0]

    def profiler(frame, event, arg):
        if event == "call":
            calls[0] += 1
    sys.setprofile(profiler)
    step()
    sys.setprofile(None)
    with Count():
        step()
    walls, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.thread_time()
        step()
        walls.append(time.perf_counter() - start)
        cpu.append(time.thread_time() - start_cpu)
    return {"python_calls": calls[0] / layers, "aten_ops": Count.ops / layers,
            "ms_per_layer": statistics.median(cpu) / layers * 1e3,
            "wall_ms_per_layer": statistics.median(walls) / layers * 1e3,
            "ops_by_name": {k: v / layers for k, v in sorted(names.items())}}


NUMBERS = ("python_calls", "aten_ops", "ms_per_layer")  # what a round's median is taken of


def _mds_ranks(a: argparse.Namespace, tp: int) -> dict:
    """Megatron-DeepSpeed's layer as ``tp`` gloo ranks, each its own process; rank 0's measurement."""
    import socket

    with socket.socket() as probe:  # a free port for the rendezvous
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([a.mds, a.ds]), MASTER_PORT=port, OMP_NUM_THREADS="1")
    ranks = [subprocess.Popen([sys.executable, __file__, "--child", "mds", "--repeats", str(a.repeats), "--tp",
                               str(tp), "--rank", str(r)], env=env, cwd=a.mds, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True) for r in range(tp)]
    outs = [p.communicate()[0] for p in ranks]
    if any(p.returncode for p in ranks):
        raise SystemExit(f"megatron_host_cpu.py: a tp {tp} rank failed")
    return json.loads(outs[0].strip().splitlines()[-1])


def tensor_parallel(a: argparse.Namespace) -> None:
    """Megatron-DeepSpeed's layer at tp 1 and at ``a.tp``, alternated over ``a.rounds``: what tensor parallelism adds
    to its host's work per layer (Python calls, aten ops by name). The wall time at tp > 1 holds gloo's all-reduces
    on this CPU, so it is recorded but is not the host's issuing work."""
    import torch

    rounds: dict[str, list[dict]] = {"1": [], str(a.tp): []}
    for _ in range(a.rounds):
        for tp in (1, a.tp):
            rounds[str(tp)].append(_mds_ranks(a, tp))
    last = {tp: r[-1]["ops_by_name"] for tp, r in rounds.items()}
    one, many = last["1"], last[str(a.tp)]
    result = {
        "what": f"Megatron-DeepSpeed f4157bea's ParallelTransformerLayer at tp 1 and tp {a.tp} (gloo, rank 0): host "
                "work per layer (forward + backward) on CPU tensors of width 64 x 16 tokens",
        "made_by": f"benchmarks/measure/megatron_host_cpu.py --tp {a.tp}",
        "date": datetime.date.today().isoformat(),
        "host": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
        "torch": torch.__version__, "python": platform.python_version(),
        "rounds": {tp: [{k: r[k] for k in NUMBERS} for r in rs] for tp, rs in rounds.items()},
        "median": {tp: {k: statistics.median(r[k] for r in rs) for k in NUMBERS} for tp, rs in rounds.items()},
        "ops_differing": {name: {"1": one.get(name, 0.0), str(a.tp): many.get(name, 0.0)}
                          for name in sorted(set(one) | set(many)) if one.get(name, 0.0) != many.get(name, 0.0)},
    }
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"median": result["median"], "ops_differing": result["ops_differing"]}, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mds", help="a Megatron-DeepSpeed checkout (f4157bea)")
    parser.add_argument("--ds", help="where DeepSpeed is installed (pip --target)")
    parser.add_argument("--out", help="the JSON file to write")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the three codes, alternated")
    parser.add_argument("--repeats", type=int, default=30, help="timed passes per round")
    parser.add_argument("--tp", type=int, default=1,
                        help="> 1: Megatron-DeepSpeed's layer at tp 1 and at this tensor parallelism (gloo ranks)")
    parser.add_argument("--child", choices=CODES, help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.child:
        result = measure(a.child, a.repeats, a.tp, a.rank)
        if a.rank == 0:
            print(json.dumps(result))
        return
    if a.tp > 1:
        tensor_parallel(a)
        return
    import torch

    rounds: dict[str, list[dict]] = {c: [] for c in CODES}
    for _ in range(a.rounds):
        for code in CODES:  # each code in its own process: both Megatrons are packages named "megatron"
            env = dict(os.environ)
            if code == "mds":
                env["PYTHONPATH"] = os.pathsep.join([a.mds, a.ds])
            out = subprocess.run([sys.executable, __file__, "--child", code, "--repeats", str(a.repeats)], env=env,
                                 capture_output=True, text=True, check=True, cwd=a.mds if code == "mds" else None)
            rounds[code].append(json.loads(out.stdout.strip().splitlines()[-1]))
    result = {
        "what": "host work per transformer layer (forward + backward) on CPU tensors of width 64 x 16 tokens",
        "made_by": "benchmarks/measure/megatron_host_cpu.py",
        "date": datetime.date.today().isoformat(),
        "host": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
        "torch": torch.__version__, "python": platform.python_version(),
        "codes": {"pytorch": "benchmarks/measure/small_work_gpu.py's plain-PyTorch layer",
                  "mcore": "Megatron-Core 0.16.1 TransformerLayer, local spec, fusions off",
                  "mds": "Megatron-DeepSpeed f4157bea ParallelTransformerLayer, default flags"},
        "rounds": rounds,
        "median": {c: {k: statistics.median(r[k] for r in rounds[c]) for k in NUMBERS} for c in CODES},
    }
    text = json.dumps(result, indent=1)
    if a.out:
        Path(a.out).write_text(text + "\n")
    print(json.dumps(result["median"], indent=1))


if __name__ == "__main__":
    main()
