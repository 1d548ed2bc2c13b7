"""Fuzz class of check-step (issue 48, a second campaign): what a run asks of this host's memory. An input shape
past the host (``--input-shape 100000x100000``: 37 GiB of float32 on a smaller host) or a step whose own allocation
the allocator refuses ended in exit 3 (``internal error: RuntimeError: DefaultCPUAllocator: can't allocate memory``):
now exit 2, one line, the input shape named before anything is allocated, and the allocator's refusal said as what
it is."""

from __future__ import annotations

import os

import pytest

from meshplan.cli import main

pytest.importorskip("torch")
HOST_GIB = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
MODULE = '''import torch
from torch import nn


class Hungry(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x).sum() + torch.empty(10**13, dtype=torch.float32)[:1].sum()  # 40 TB


def hungry():
    return Hungry(), (torch.randn(4, 8),)


def lin():
    return nn.Linear(8, 8)
'''


def one_line(args, capsys) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "internal error" not in err[0]
    return err[0]


@pytest.mark.parametrize("shape", ["100000x100000", "99999999999x99999999999x9999999", "8x8,1000000x1000000"])
def test_inputs_past_a_quarter_of_the_host_are_refused_before_allocating(shape, tmp_path, capsys):
    """Each input's elements x its dtype's bytes, summed: 100000 x 100000 x 4 B = 37.3 GiB, against a quarter of the
    host's memory (the step's activations and gradients sit beside its inputs)."""
    (tmp_path / "mods.py").write_text(MODULE)
    shapes = [a for s in shape.split(",") for a in ("--input-shape", s)]
    line = one_line(["check-step", f"{tmp_path / 'mods.py'}:lin", *shapes, "--dtype", "float32"], capsys)
    assert line.startswith(f"meshplan: error: input-shape={shape}: ") and f"host's {HOST_GIB:.3g} GiB" in line
    if shape == "100000x100000" and HOST_GIB < 4 * 37.25:
        assert "37.3 GiB of inputs" in line


def test_an_allocation_the_host_refuses_is_one_line_not_an_internal_error(tmp_path, capsys):
    (tmp_path / "mods.py").write_text(MODULE)
    line = one_line(["check-step", f"{tmp_path / 'mods.py'}:hungry", "--steps", "3"], capsys)
    assert line.startswith("meshplan: error: out of memory: RuntimeError:") and "can't allocate memory" in line
