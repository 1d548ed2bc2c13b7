"""The host's cost per aten op by PyTorch release, measured on this CPU (issue 79, lead 1: the per-kernel host cost of
the megatron-deepspeed preset was measured on an H200 host under PyTorch 2.11 (docs/SMALL_WORK_GPU.md), while vTrain's
runs used PyTorch 2.0.1 (VIA-Research/vTrain Dockerfile); no published measurement of the dispatcher's and autograd's
per-op CPU time by release was found, so this measures it).

The same plain-PyTorch GPT layer, its attention as Megatron's unfused core attention (megatron/model/transformer.py
CoreAttention: baddbmm scores, the masked softmax, bmm; scaled_dot_product_attention would take a different path in
each release and launch different ops), runs forward and backward on CPU tensors so small (width 64, 16 tokens) that
each aten op costs its dispatch, its autograd bookkeeping and the Python around it, under each interpreter given with
``--python`` (one virtual environment per PyTorch release, the same CPython minor version; one intra-op thread). Per
release: the issuing thread's CPU seconds per layer (``time.thread_time``: on a shared machine, what other processes
take is not counted; the releases' runs interleaved, the median of ``--rounds``), the aten ops per layer (a
TorchDispatchMode) and their quotient. The ratio of two releases' seconds per layer is what a host-bound eager step's
host time scales by between them on one CPU (what the CUDA launch itself costs, the driver's, is not in it);
tests/test_torch_release_host.py reads the committed file.

    python -m venv /tmp/t20 && /tmp/t20/bin/pip install torch==2.0.1 'numpy<2'
    python benchmarks/measure/torch_release_host_cpu.py --python /tmp/t20/bin/python --python .venv/bin/python \\
        --out data/measured/2026-11-28-torch-release-host-cpu.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
from pathlib import Path

WIDTH, TOKENS, LAYERS, REPEATS = 64, 16, 4, 400

# run in the child interpreter: prints one JSON line
CHILD = r"""
import json, statistics, sys, time
import torch
nn, F = torch.nn, torch.nn.functional
torch.set_num_threads(1)
W, S, H = {width}, {tokens}, 2

class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(W), nn.LayerNorm(W)
        self.qkv, self.proj = nn.Linear(W, 3 * W), nn.Linear(W, W)
        self.fc1, self.fc2 = nn.Linear(W, 4 * W), nn.Linear(4 * W, W)
        self.register_buffer("mask", torch.ones(S, S, dtype=torch.bool).triu(1))

    def forward(self, x):
        s, b, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(s, b * H, 3 * W // H).transpose(0, 1).chunk(3, dim=-1)
        scores = torch.baddbmm(torch.empty(b * H, s, s), q, k.transpose(1, 2), beta=0.0, alpha=(W // H) ** -0.5)
        probs = torch.softmax(scores.masked_fill(self.mask, -10000.0), dim=-1)
        a = torch.bmm(probs, v).transpose(0, 1).reshape(s, b, W)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))

layers = [Layer() for _ in range({layers})]
x0 = torch.randn(S, 1, W, requires_grad=True)

def step():
    h = x0
    for layer in layers:
        h = layer(h)
    h.sum().backward()

from torch.utils._python_dispatch import TorchDispatchMode
class Count(TorchDispatchMode):
    n = 0
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        Count.n += 1
        return func(*args, **(kwargs or {{}}))
with Count():
    step()
for _ in range(50):
    step()
cpus = []
for _ in range({repeats}):
    t = time.thread_time()
    step()
    cpus.append(time.thread_time() - t)
cpu = statistics.median(cpus)
print(json.dumps({{"torch": torch.__version__, "python": sys.version.split()[0],
                  "cpu_per_layer_s": cpu / {layers}, "aten_ops_per_layer": Count.n / {layers},
                  "s_per_aten_op": cpu / Count.n}}))
"""


def child_run(python: str) -> dict:
    """One child run's figures under ``python``."""
    code = CHILD.format(width=WIDTH, layers=LAYERS, tokens=TOKENS, repeats=REPEATS)
    out = subprocess.run([python, "-c", code], check=True, capture_output=True, text=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def measure(pythons: list[str], rounds: int = 3) -> list[dict]:
    """Each release's figures: its median child run by seconds per aten op over ``rounds`` rounds, the releases'
    runs interleaved within each round (so a slow spell of the shared machine falls on all of them)."""
    runs: list[list[dict]] = [[] for _ in pythons]
    for _ in range(rounds):
        for i, python in enumerate(pythons):
            runs[i].append(child_run(python))
    out = []
    for rs in runs:
        rs.sort(key=lambda r: r["s_per_aten_op"])
        out.append({**rs[len(rs) // 2], "rounds_s_per_aten_op": [r["s_per_aten_op"] for r in rs]})
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", action="append", required=True, help="an interpreter with one PyTorch release")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    releases = measure(args.python, args.rounds)
    out = {"date": datetime.date.today().isoformat(), "cpu": platform.processor() or platform.machine(),
           "layer": {"width": WIDTH, "tokens": TOKENS, "layers": LAYERS, "repeats": REPEATS},
           "releases": releases}
    text = json.dumps(out, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
