"""An aten call as JSON, so that measure/replay.py can run the same op on real tensors of the same shapes.

Tensors become ``{"tensor": i}`` (the i-th tensor of the call in pytree order, which is the order of
``TracedOp.inputs``); torch's enum-like values become one-key objects (``{"dtype": "float32"}``,
``{"device": "cpu"}``, ``{"layout": "strided"}``, ``{"memory_format": "contiguous_format"}``); numbers, strings,
booleans and None stay as they are; anything else (a generator, a profiler handle) becomes ``{"opaque": type}``,
which replay refuses. Floats that JSON cannot hold (inf, nan) are written as ``{"float": "inf"}``.
"""

from __future__ import annotations

import json
import math
from typing import Any

import torch

from meshplan.trace import flops as fl

TAGS = {"pointwise": torch.Tag.pointwise, "reduction": torch.Tag.reduction}


def encode_call(args: tuple, kwargs: dict) -> str:
    """The call ``func(*args, **kwargs)`` as compact JSON (see the module docstring)."""
    counter = [0]

    def enc(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            counter[0] += 1
            return {"tensor": counter[0] - 1}
        if isinstance(x, bool) or x is None or isinstance(x, (int, str)):
            return x
        if isinstance(x, float):
            return x if math.isfinite(x) else {"float": repr(x)}
        if isinstance(x, torch.dtype):
            return {"dtype": str(x).removeprefix("torch.")}
        if isinstance(x, torch.device):
            return {"device": x.type}
        if isinstance(x, torch.layout):
            return {"layout": str(x).removeprefix("torch.")}
        if isinstance(x, torch.memory_format):
            return {"memory_format": str(x).removeprefix("torch.")}
        if isinstance(x, (torch.SymInt, torch.SymBool)):
            return int(x)
        if isinstance(x, torch.SymFloat):
            return enc(float(x))
        if isinstance(x, (list, tuple)):
            return [enc(v) for v in x]
        if isinstance(x, dict):
            return {str(k): enc(v) for k, v in x.items()}
        return {"opaque": type(x).__name__}

    return json.dumps([enc(list(args)), enc(dict(kwargs))], separators=(",", ":"))


def tags(func: Any) -> tuple[str, ...]:
    """The tags of ``func`` that fusion analysis reads."""
    return tuple(name for name, tag in TAGS.items() if tag in func.tags)


def arg_names(func: Any, args: tuple, kwargs: dict) -> tuple[str, ...]:
    """The schema name of each tensor argument, in the order ``fl._tensors((args, kwargs))`` lists them (a list
    argument, e.g. ``cat``'s ``tensors``, names each of its tensors)."""
    names = [a.name for a in func._schema.arguments]
    found = [names[i] if i < len(names) else f"arg{i}" for i, a in enumerate(args) for _ in fl._tensors(a)]
    return tuple(found + [k for k, v in kwargs.items() for _ in fl._tensors(v)])


def result_slots(out: Any) -> tuple[int, ...]:
    """For each tensor result, its position in the op's returned tuple (ops such as convolution_backward return
    None for results not asked for, which the recorder drops)."""
    if isinstance(out, (tuple, list)):
        return tuple(i for i, o in enumerate(out) for _ in fl._tensors(o))
    return (0,)


def _plain(value: Any) -> Any:
    """A non-tensor argument as plain data: numbers, strings, tuples of them (dtypes, devices and layouts by name)."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
        return value.node.hint if hasattr(value.node, "hint") else str(value)
    return str(value)


def call_attrs(func: Any, args: tuple, kwargs: dict) -> tuple[tuple[str, Any], ...]:
    """The op's non-tensor arguments by schema name (``dim``, ``keepdim``, ``groups`` …), for the sharding rules."""
    return tuple((k, _plain(v)) for k, v in fl.named_args(func, args, kwargs).items() if not fl._tensors(v))
