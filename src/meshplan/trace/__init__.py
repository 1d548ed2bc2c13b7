"""Arbitrary PyTorch models: trace an ``nn.Module`` on fake tensors into an op graph, cost and time each op on
any hardware preset, and find the peak memory by liveness analysis.

    module + example input shapes ──► capture.py (FakeTensorMode + TorchDispatchMode, forward and backward)
        ──► graph.py Trace (TracedOp per aten op: shapes, dtypes, storages, FLOPs, bytes, phase)
        ──► cost.py (OpCost records, roofline time)      liveness.py (peak memory, where, what)

graph, cost and liveness need no torch; ``trace_module`` imports it when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from meshplan.errors import MissingDependency
from meshplan.trace.cost import TimedOp, op_cost, op_costs, time_ops
from meshplan.trace.graph import Storage, TensorInfo, Trace, TracedOp
from meshplan.trace.liveness import PeakMemory, peak_memory

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["PeakMemory", "Storage", "TensorInfo", "TimedOp", "Trace", "TracedOp", "op_cost", "op_costs",
           "peak_memory", "time_ops", "trace_module"]


def trace_module(module: Any, inputs: Sequence[Any], *, backward: bool = True, param_dtype: Any = None,
                 real: bool = False) -> Trace:
    """Trace ``module(*inputs)`` forward and backward on fake tensors, or on its real ones (see
    capture.trace_module)."""
    try:
        from meshplan.trace.capture import trace_module as run
    except ModuleNotFoundError as exc:
        if exc.name == "torch":
            raise MissingDependency("torch", "torch") from None
        raise
    return run(module, inputs, backward=backward, param_dtype=param_dtype, real=real)
