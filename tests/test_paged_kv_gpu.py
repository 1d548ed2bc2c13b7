"""benchmarks/measure/paged_kv_gpu.py, the device check of a fixed cost per KV page: its arithmetic here, and its Triton
kernel run by Triton's interpreter on the CPU against a plain PyTorch softmax attention over the same pages."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MEASURE = ROOT / "benchmarks" / "measure"


def _module():
    spec = importlib.util.spec_from_file_location("paged_kv_gpu", MEASURE / "paged_kv_gpu.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tables_follow_the_layouts():
    m = _module()
    # lockstep growth: page j of sequence b is the (j·B + b)-th block handed out
    assert m.table(2, 3, "interleaved").tolist() == [[0, 2, 4], [1, 3, 5]]
    assert m.table(2, 3, "contiguous").tolist() == [[0, 1, 2], [3, 4, 5]]


def test_traffic_shows_its_arithmetic():
    m = _module()
    # 16 sequences x ceil(1024 / 16) = 64 pages, K and V: 2,048 pages;
    # bytes 2 (K, V) x 16 x 1,024 tokens x 32 heads x 128 x 2 B = 268,435,456
    assert m.traffic(16, 32, 1024, 16) == (2048, 268_435_456)
    # the grid held at B·H = 512: pages per call grow as the heads per page row shrink, the bytes do not change
    pages = [m.traffic(512 // h, h, 2048, 16)[0] for h in m.HEADS]
    assert pages == sorted(pages) and len({m.traffic(512 // h, h, 2048, 16)[1] for h in m.HEADS}) == 1


def test_fit_recovers_a_page_cost_and_a_rate():
    m = _module()
    rows = []
    for h in m.HEADS:
        for c in m.CONTEXTS:
            pages, nbytes = m.traffic(512 // h, h, c, 16)
            rows.append({"pages": pages, "bytes": nbytes, "seconds": pages * 3.5e-9 + nbytes / 2.94e12})
    got = m.fit(rows)
    assert np.isclose(got["t_page_ns"], 3.5) and np.isclose(got["bw_tb_s"], 2.94)


KERNEL_CHECK = """
import sys, torch
sys.path.insert(0, sys.argv[1])
import paged_kv_kernel as pk
torch.manual_seed(0)
B, H, D, PAGE = 2, 2, 128, 16
lens = torch.tensor([40, 130], dtype=torch.int32)
pages = [(int(n) + PAGE - 1) // PAGE for n in lens]
blocks = sum(pages) + 3
order = torch.randperm(blocks)
table = torch.zeros(B, 16, dtype=torch.int32)
table[0, :pages[0]] = order[:pages[0]]
table[1, :pages[1]] = order[pages[0]:sum(pages)]
k, v = (torch.randn(blocks, PAGE, H, D, dtype=torch.float16) for _ in range(2))
q = (torch.randn(B, H, D) / D ** 0.5).to(torch.float16)
out = pk.run(torch, q, k, v, table, lens)
for b in range(B):
    rows = [(int(table[b, t // PAGE]), t % PAGE) for t in range(int(lens[b]))]
    keys = torch.stack([k[p, o] for p, o in rows]).float()
    values = torch.stack([v[p, o] for p, o in rows]).float()
    ref = torch.einsum("hn,nhd->hd", torch.einsum("hd,nhd->hn", q[b].float(), keys).softmax(-1), values)
    assert (out[b] - ref).abs().max() < 1e-4, b
print("ok")
"""


def test_triton_kernel_matches_softmax_attention_on_the_cpu():
    env = os.environ | {"TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", KERNEL_CHECK, str(MEASURE)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
