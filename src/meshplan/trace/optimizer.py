"""The optimizer step as traced ops: every aten op one ``optimizer.step()`` runs, phase ``"opt"``.

The step is taken on fake copies of the parameters with fake gradients (no memory, as capture.py), and the
*second* step is recorded: the first creates the optimizer's state (``exp_avg``, ``exp_avg_sq``, the step
counter), which a training loop does once. Which implementation runs (PyTorch's per-parameter loop, the
multi-tensor ``foreach`` kernels or the ``fused`` kernel) is the caller's choice through ``make``; pass the one
the real run uses (measure/step.py passes ``foreach`` as torch.optim would pick it for the real parameters,
since fake tensors would steer that choice to the loop).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from meshplan.trace.capture import Recorder, traced_ops
from meshplan.trace.graph import TracedOp


def trace_optimizer(params: Sequence[torch.Tensor], make: Callable[[list[torch.Tensor]], Any]) -> list[TracedOp]:
    """The ops of one steady-state ``make(params).step()`` over fake copies of ``params`` (trainable ones only,
    each once), in order, phase ``"opt"``."""
    unique = list({id(p): p for p in params if p.requires_grad}.values())
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        fakes: list[torch.Tensor] = []
        for p in unique:
            f = torch.nn.Parameter(mode.from_tensor(p.detach()), requires_grad=True)
            f.grad = torch.zeros_like(f)
            fakes.append(f)
        optimizer = make(fakes)
        optimizer.step()  # creates the state
    rec = Recorder("optimizer")
    with mode, rec:
        optimizer.step()
    rec.module_prefix = ""
    return traced_ops(rec.rows, ["opt"] * len(rec.rows))
