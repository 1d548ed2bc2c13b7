"""The host's work per transformer layer of three codes, measured on this CPU (issue 46, item 3: "the host side of
dispatch is CPU work ... measured on the machine at hand"): Megatron-DeepSpeed's own ParallelTransformerLayer, the
stack of the issue's held-out small-work runs; Megatron-Core 0.16.1's local-spec TransformerLayer, whose per-kernel
host time a lent H200 measured (data/measured/gpu/2026-11-26-nvidia-h200-small-work-megatron.json, the preset's
50 µs); and benchmarks/small_work_gpu.py's plain-PyTorch layer, whose per-kernel host time the ``pytorch-fsdp``
preset holds (25 µs). Each layer runs forward and backward on CPU tensors so small (width 64, 16 tokens) that each
aten op is its dispatch and the Python around it: the CPU analogue of a host-bound GPU step. Besides the wall
clock per layer, the Python function calls (``sys.setprofile``) and the aten ops (a TorchDispatchMode) per layer.

So the preset's claim that Megatron-DeepSpeed's layer costs its host what Megatron-Core's does is a measurement here,
not an assumption: tests/test_megatron_host_cpu.py derives Megatron-DeepSpeed's host seconds per kernel from the
committed file (its layer's time over the plain layer's, times the plain layer's measured per-kernel cost, over the
kernels each launches on a GPU) and holds the ``megatron-deepspeed`` preset to it.

Megatron-DeepSpeed is not on PyPI. Run with a checkout of microsoft/Megatron-DeepSpeed (f4157bea) and DeepSpeed
installed beside it (pure Python, no ops built):

    DS_BUILD_OPS=0 pip install --target /tmp/ds deepspeed==0.19.8 six --no-deps
    python benchmarks/megatron_host_cpu.py --mds /path/to/Megatron-DeepSpeed --ds /tmp/ds \\
        --out data/measured/2026-11-26-megatron-host-cpu.json

On a CPU the CUDA-only paths are bypassed as benchmarks/small_work_megatron.py bypasses them (the CUDA RNG tracker's
fork: dropout is 0); Megatron-DeepSpeed's fused LayerNorm is torch's on a CPU (its transformer.py picks it by device),
its masked softmax takes its torch path, and gradient-accumulation fusion (an apex kernel) is off. Both Megatron
layers run their default fusion flags but Megatron-Core's, which run off as on the H200 (the preset's measurement).
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
from pathlib import Path

HERE = Path(__file__).resolve().parent
WIDTH, HEADS, TOKENS, LAYERS = 64, 2, 16, 4
CODES = ("pytorch", "mcore", "mds")


def _layers(torch, code: str):
    """``LAYERS`` layers of ``code`` and the call that runs one through a hidden state."""
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
    return _mds_layers(torch)


def _mds_layers(torch):
    """Megatron-DeepSpeed's layers, its arguments parsed as its pretrain_gpt.py parses them."""
    import torch.distributed as dist

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    sys.argv = ["pretrain_gpt.py", "--num-layers", str(LAYERS), "--hidden-size", str(WIDTH),
                "--num-attention-heads", str(HEADS), "--seq-length", str(TOKENS),
                "--max-position-embeddings", str(TOKENS), "--micro-batch-size", "1", "--global-batch-size", "1",
                "--hidden-dropout", "0", "--attention-dropout", "0", "--no-gradient-accumulation-fusion",
                "--use-cpu-initialization"]
    from megatron import global_vars
    from megatron.arguments import core_transformer_config_from_args, parse_args, validate_args

    args = parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29583")
    dist.init_process_group("gloo", rank=0, world_size=1)
    with contextlib.redirect_stdout(sys.stderr):
        validate_args(args)
    global_vars.set_args(args)
    import megatron.core.tensor_parallel.random as mr
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(1, 1)
    mr.CudaRNGStatesTracker.fork = lambda self, name=None: contextlib.nullcontext()
    from megatron.model.transformer import ParallelTransformerLayer

    config = core_transformer_config_from_args(args)
    layers = torch.nn.ModuleList(ParallelTransformerLayer(config, i + 1) for i in range(LAYERS))

    return layers, (TOKENS, 1, WIDTH), lambda layer, h, m: layer(h, m)


def measure(code: str, repeats: int) -> dict:
    """One code's layers: Python calls, aten ops and wall seconds per layer of forward + backward."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    layers, shape, run = _layers(torch, code)
    mask = torch.ones(1, 1, TOKENS, TOKENS, dtype=torch.bool).triu(1)

    def step() -> None:
        h = torch.randn(*shape, requires_grad=True)
        for layer in layers:
            h = run(layer, h, mask)
            h = h[0] if isinstance(h, tuple) else h  # Megatron's layers return (hidden, context) or (hidden, loss)
        h.float().sum().backward()

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.ops += 1
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
    walls = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        walls.append(time.perf_counter() - start)
    return {"python_calls": calls[0] / LAYERS, "aten_ops": Count.ops / LAYERS,
            "ms_per_layer": statistics.median(walls) / LAYERS * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mds", help="a Megatron-DeepSpeed checkout (f4157bea)")
    parser.add_argument("--ds", help="where DeepSpeed is installed (pip --target)")
    parser.add_argument("--out", help="the JSON file to write")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the three codes, alternated")
    parser.add_argument("--repeats", type=int, default=30, help="timed passes per round")
    parser.add_argument("--child", choices=CODES, help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.child:
        print(json.dumps(measure(a.child, a.repeats)))
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
        "made_by": "benchmarks/megatron_host_cpu.py",
        "date": datetime.date.today().isoformat(),
        "host": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
        "torch": torch.__version__, "python": platform.python_version(),
        "codes": {"pytorch": "benchmarks/small_work_gpu.py's plain-PyTorch layer",
                  "mcore": "Megatron-Core 0.16.1 TransformerLayer, local spec, fusions off",
                  "mds": "Megatron-DeepSpeed f4157bea ParallelTransformerLayer, default flags"},
        "rounds": rounds,
        "median": {c: {k: statistics.median(r[k] for r in rounds[c]) for k in rounds[c][0]} for c in CODES},
    }
    text = json.dumps(result, indent=1)
    if a.out:
        Path(a.out).write_text(text + "\n")
    print(json.dumps(result["median"], indent=1))


if __name__ == "__main__":
    main()
