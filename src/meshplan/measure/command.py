"""``meshplan check-step``: the model (MODULE:FACTORY, or a zoo name from the research package: plugins.py), its
inputs and optimizer, then check_step.

A factory may return the module alone, or ``(module, inputs)``; with the module alone, ``--input-shape`` /
``--dtype`` give the inputs, made real: floating ones from a standard normal, integer ones uniform in [0, n) with
n the smallest ``num_embeddings`` of the model's ``nn.Embedding`` layers (token ids it can look up), else 2.
The optimizer is built as the training loop would build it: AdamW (or Adam, SGD with or without momentum) at lr 1e-4,
with the implementation torch.optim picks for these parameters (the per-parameter loop on a CPU, the ``foreach``
kernels on a GPU), which the trace of its step then follows.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import Any

from meshplan.errors import MissingDependency, SpecError
from meshplan.fields import one_line

# the optimizers check-step builds with torch.optim, as Plan.optimizer names them (of specs.plan.OPTIMIZERS)
TORCH_OPTIMIZERS = ("adamw", "adam", "sgd-momentum", "sgd")


@dataclass(frozen=True, kw_only=True)
class Target:
    name: str
    model: Any
    inputs: tuple[Any, ...]


def _require_torch() -> Any:
    try:
        import torch
    except ModuleNotFoundError:
        raise MissingDependency("torch", "torch") from None
    return torch


def load_target(ref: str, shapes: tuple[str, ...] = (), dtypes: tuple[str, ...] = (), device: str = "cpu",
                ) -> Target:
    """The module and real inputs named by ``ref`` (module docstring), on ``device``."""
    torch = _require_torch()
    from meshplan.measure.plugins import MissingResearch, zoo_models

    zoo = zoo_models()
    if ref in zoo:
        model, inputs = zoo[ref].build()
    else:
        if ":" not in ref and not zoo:
            raise MissingResearch(f"model={ref!r} is not MODULE:FACTORY; the model zoo")
        if ":" not in ref:
            raise SpecError(f"model={ref!r} is not in the zoo ({', '.join(zoo)}) nor MODULE:FACTORY")
        from meshplan.trace.command import first_line, load_factory, parse_shape, user_code

        factory = load_factory(ref)
        try:
            with user_code():
                built = factory() if callable(factory) and not isinstance(factory, torch.nn.Module) else factory
        except Exception as exc:  # noqa: BLE001  (the user's factory failed)
            raise SpecError(f"model={ref!r}: the factory failed: {first_line(exc)}") from None
        if isinstance(built, tuple) and len(built) == 2 and isinstance(built[0], torch.nn.Module):
            if shapes or dtypes:  # were ignored, a typo in them unseen
                raise SpecError(f"{'input-shape' if shapes else 'dtype'}={(shapes or dtypes)[0]!r}: {ref} returns its "
                                "own inputs (module, inputs); leave --input-shape and --dtype out")
            model, inputs = built[0], tuple(built[1])
        elif isinstance(built, torch.nn.Module):
            if not shapes:
                raise SpecError("input-shape is required when the factory returns the module alone (e.g. 4x128)")
            model, inputs = built, _inputs(torch, built, [parse_shape(s) for s in shapes], dtypes)
        else:
            raise SpecError(f"model={ref!r} returned {type(built).__name__}, not a torch.nn.Module or "
                            "(module, inputs)")
    dev = torch.device(device)
    return Target(name=ref, model=model.to(dev).train(),
                  inputs=tuple(x.to(dev) if isinstance(x, torch.Tensor) else x for x in inputs))


def _inputs(torch: Any, model: Any, shapes: list[tuple[int, ...]], dtypes: tuple[str, ...]) -> tuple[Any, ...]:
    dtypes = dtypes or ("int64",)
    if len(dtypes) not in (1, len(shapes)):
        raise SpecError(f"give one --dtype or one per --input-shape ({len(shapes)} inputs), got {len(dtypes)}")
    from meshplan.trace.capture import torch_dtype

    vocab = [m.num_embeddings for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    kinds = [torch_dtype(dtypes[i] if len(dtypes) > 1 else dtypes[0]) for i in range(len(shapes))]
    _fits_the_host(shapes, [k.itemsize for k in kinds])
    out = []
    for shape, dtype in zip(shapes, kinds, strict=True):
        if dtype.is_floating_point:
            out.append(torch.randn(shape, dtype=dtype))
        else:
            out.append(torch.randint(0, min(vocab) if vocab else 2, shape, dtype=dtype))
    return tuple(out)


def _fits_the_host(shapes: list[tuple[int, ...]], itemsizes: list[int]) -> None:
    """Refuse inputs over a quarter of this host's memory before allocating them: the step runs for real, its
    activations and gradients beside them (a 100000x100000 float32 input asked 40 GB of a 16 GB host: the allocator's
    failure was an internal error)."""
    need = sum(math.prod(shape) * size for shape, size in zip(shapes, itemsizes, strict=True))
    host = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if need > host / 4:
        shown = ",".join("x".join(map(str, shape)) for shape in shapes)
        raise SpecError(f"input-shape={one_line(shown)}: {need / 2**30:.3g} GiB of inputs, more than a quarter of this "
                        f"host's {host / 2**30:.3g} GiB (check-step runs the step: activations and gradients beside)")


def optimizer_factory(name: str, params: list[Any]) -> Any:
    """A builder of ``name`` over a parameter list, with the implementation torch.optim picks for ``params``."""
    torch = _require_torch()
    if name not in TORCH_OPTIMIZERS:
        raise SpecError(f"optimizer={name!r} must be one of {', '.join(TORCH_OPTIMIZERS)}")
    from torch.optim.optimizer import _default_to_fused_or_foreach

    _, foreach = _default_to_fused_or_foreach([p for p in params if p.requires_grad], differentiable=False,
                                              use_fused=False)
    if name in ("sgd", "sgd-momentum"):  # plain SGD keeps no state; with momentum one buffer per parameter
        momentum = 0.9 if name == "sgd-momentum" else 0.0
        return lambda ps: torch.optim.SGD(ps, lr=1e-4, momentum=momentum, foreach=foreach)
    cls = torch.optim.AdamW if name == "adamw" else torch.optim.Adam
    return lambda ps: cls(ps, lr=1e-4, foreach=foreach)


def check_step_ref(ref: str, *, shapes: tuple[str, ...] = (), dtypes: tuple[str, ...] = (), optimizer: str = "adamw",
                   settings: Any = None) -> Any:
    """Load the model ``ref`` names (module docstring), then trace, predict, measure: a CheckResult."""
    _require_torch()
    from meshplan.measure.check import CheckSettings, check_step

    settings = settings or CheckSettings(optimizer=optimizer)
    target = load_target(ref, shapes, dtypes, settings.device)
    make = optimizer_factory(optimizer, list(target.model.parameters()))
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")  # a failed fake trace is retried for real
    level = fake_log.level
    fake_log.setLevel(logging.CRITICAL)
    try:
        return check_step(target.name, target.model, target.inputs, make, settings)
    finally:
        fake_log.setLevel(level)

