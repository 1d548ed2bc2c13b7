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
from meshplan.trace.cost import TimedOp, op_cost, op_costs, time_traced_ops
from meshplan.trace.graph import Storage, TensorInfo, Trace, TracedOp
from meshplan.trace.liveness import PeakMemory, peak_memory

if TYPE_CHECKING:
    from meshplan.trace.capture import trace_module

__all__ = ["PeakMemory", "Storage", "TensorInfo", "TimedOp", "Trace", "TracedOp", "op_cost", "op_costs",
           "peak_memory", "time_traced_ops", "trace_module"]


def __getattr__(name: str) -> Any:
    """``trace_module`` (capture.trace_module: trace ``module(*inputs)`` forward and backward on fake tensors, or on
    its real ones), imported on first use so that the rest of the package needs no torch."""
    if name != "trace_module":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        from meshplan.trace.capture import trace_module
    except ModuleNotFoundError as exc:
        if exc.name == "torch":
            raise MissingDependency("torch", "torch") from None
        raise
    return trace_module
