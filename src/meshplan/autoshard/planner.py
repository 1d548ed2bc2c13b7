"""The sharding planner end to end: a model (a preset, a Hugging Face config.json or ``module.py:factory``) traced on
fake tensors, its intra-operator plan on the cluster's mesh, and pipeline slicings over sub-meshes; the fastest
plan that fits wins.

Inputs: a factory gets the ``--input-shape`` tensors; a preset or config.json gets token ids of shape (global batch /
micro-batches, sequence). Pipelines keep the traced micro-batch: ``stages`` from 2 up to the micro-batches per step
(1F1B needs at least as many micro-batches as stages), each on G/p devices (stages.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from meshplan.autoshard.blocks import find_blocks
from meshplan.autoshard.dataflow import flow
from meshplan.autoshard.memory import Accounting
from meshplan.autoshard.mesh import device_mesh, sub_mesh
from meshplan.autoshard.problem import Problem, build
from meshplan.autoshard.solve import Sharding, plan
from meshplan.autoshard.stages import Pipeline, parts, pipeline
from meshplan.errors import SpecError
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import Cluster, load_system
from meshplan.specs.model_load import load_model, preset_names

STAGE_MODES = ("off", "auto", "search")


@dataclass(frozen=True, kw_only=True)
class Request:
    model: str
    system: str = "h100"
    gpus: int = 8
    input_shapes: tuple[tuple[int, ...], ...] = ()  # a factory's inputs
    dtypes: tuple[str, ...] = ("int64",)
    param_dtype: str | None = "bfloat16"
    global_batch: int | None = None  # a preset's or config's sequences per step (default: one per GPU)
    seq: int | None = None
    micro_batches: int = 1
    mesh: tuple[int, ...] | None = None
    headroom: float = 0.0  # share of HBM left free
    stages: str = "auto"  # off | auto (only when one stage does not fit) | search
    nvlink_domain: int | None = None


@dataclass(frozen=True, kw_only=True)
class Result:
    request: Request
    name: str
    params: int
    layers: int  # of the full model (blocks of its largest tied group)
    traced_layers: int
    cluster: Cluster
    intra: Sharding
    pipelines: tuple[Pipeline, ...]
    timings: dict[str, float] = field(hash=False)

    @property
    def best(self) -> Sharding | Pipeline:
        options: list[Any] = [p for p in self.pipelines if p.fits]
        if self.intra.fits:
            options.append(self.intra)
        return min(options, key=lambda o: o.step_time) if options else self.intra


def load(request: Request) -> tuple[Any, list, str, int | None]:
    """(module, inputs, name, full depth or None) of the request's model (module docstring)."""
    ref = request.model
    if ref.endswith(".json"):
        from meshplan.autoshard.models import depth, hf_model, read_config

        config = read_config(ref)
        seq = request.seq or min(int(config.get("max_position_embeddings") or config.get("n_positions") or 2048), 4096)
        return hf_model(config), _ids(request, seq), Path(ref).parent.name or Path(ref).stem, depth(config)
    if ref in preset_names() or ref.endswith(".toml"):
        spec = load_model(ref)
        seq = request.seq or spec.seq_length
        from meshplan.autoshard.torch_models import supported

        if not supported(spec):
            from meshplan.autoshard.models import hf_model, preset_config

            return hf_model(preset_config(spec)), _ids(request, seq), spec.name, spec.num_layers
        from meshplan.autoshard.models import TRACED_LAYERS
        from meshplan.autoshard.torch_models import build as build_preset

        module = build_preset(replace(spec, seq_length=max(spec.seq_length, seq)), min(TRACED_LAYERS, spec.num_layers))
        return module, _ids(request, seq), spec.name, spec.num_layers
    from meshplan.trace.command import build as build_factory
    from meshplan.trace.command import load_factory

    if not request.input_shapes:
        raise SpecError("input-shape is required for a MODULE:FACTORY model (e.g. --input-shape 8x1024)")
    dtypes = request.dtypes or ("int64",)
    inputs = [(s, dtypes[i] if len(dtypes) > 1 else dtypes[0]) for i, s in enumerate(request.input_shapes)]
    module = build_factory(load_factory(ref), ref)
    return module, inputs, type(module).__name__, None


def _ids(request: Request, seq: int) -> list:
    batch = request.global_batch or request.gpus
    if batch % request.micro_batches:
        raise SpecError(f"global-batch={batch} must be a multiple of micro-batches={request.micro_batches}")
    return [((batch // request.micro_batches, seq), "int64")]


def run(request: Request) -> Result:
    """Trace, plan on the whole mesh, and (``stages``) on sub-meshes as pipelines; see the module docstring."""
    if request.stages not in STAGE_MODES:
        raise SpecError(f"stages={request.stages!r} must be one of {', '.join(STAGE_MODES)}")
    timings: dict[str, float] = {}
    clock = time.perf_counter()
    system = load_system(request.system)
    net = {"nvlink_domain": request.nvlink_domain} if request.nvlink_domain else {}
    cluster = system.cluster(request.gpus, **net)
    mesh = device_mesh(cluster, request.mesh)  # a bad mesh is refused before anything is traced
    module, inputs, name, full = load(request)
    timings["build model"] = time.perf_counter() - clock
    clock = time.perf_counter()
    trace = _trace(module, inputs, request)
    timings["trace"] = time.perf_counter() - clock
    clock = time.perf_counter()
    blocks = find_blocks(trace, layers=full)
    fl = flow(trace, blocks.block_of)
    problem = build(fl, blocks, mesh, DEFAULT)
    timings["graph"] = time.perf_counter() - clock
    limit = cluster.accelerator.hbm_bytes * (1 - request.headroom)
    clock = time.perf_counter()
    intra = plan(problem, limit, request.micro_batches)
    timings["intra-op solve"] = time.perf_counter() - clock
    clock = time.perf_counter()
    pipelines = ()
    if request.stages == "search" or (request.stages == "auto" and not intra.fits):
        pipelines = tuple(_pipelines(fl, blocks, cluster, limit, request.micro_batches))
    timings["stages"] = time.perf_counter() - clock
    layers = blocks.groups[0].layers if blocks.groups else 1
    return Result(request=request, name=name, params=trace.params if full is None else _full_params(request, trace),
                  layers=layers, traced_layers=blocks.groups[0].traced if blocks.groups else 1, cluster=cluster,
                  intra=intra, pipelines=pipelines, timings=timings)


def _trace(module: Any, inputs: list, request: Request) -> Any:
    """The trace, a model that fails on its inputs being one line (as ``meshplan trace`` says it)."""
    import logging

    from meshplan.trace import trace_module

    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    level = fake_log.level
    fake_log.setLevel(logging.CRITICAL)
    try:
        return trace_module(module, inputs, param_dtype=request.param_dtype)
    except SpecError:
        raise
    except Exception as exc:  # noqa: BLE001  (the user's model raised on its inputs)
        shown = " ".join("x".join(map(str, s)) for s, _ in inputs)
        text = str(exc).strip().splitlines()
        raise SpecError(f"model={request.model!r} failed on input-shape={shown}: {type(exc).__name__}: "
                        f"{text[0] if text else ''}") from None
    finally:
        fake_log.setLevel(level)


def _full_params(request: Request, trace: Any) -> int:
    if request.model in preset_names() or request.model.endswith(".toml"):
        return load_model(request.model).params()
    return trace.params


def stage_shape(cluster: Cluster, devices: int) -> tuple[int, ...] | None:
    """The mesh of ``devices`` consecutive ranks aligned to the tiers (whole inner tiers and a divisor of the next),
    outermost first; None when the count does not align (e.g. 12 GPUs of 8-GPU nodes)."""
    shape, left = [], devices
    for tier in cluster.tiers:
        if left == 1:
            break
        if left % tier.size == 0:
            shape.append(tier.size)
            left //= tier.size
        elif tier.size % left == 0:
            shape.append(left)
            left = 1
        else:
            return None
    return tuple(reversed(shape)) if left == 1 else None


def _pipelines(fl: Any, blocks: Any, cluster: Cluster, limit: float, micro_batches: int) -> list[Pipeline]:
    """One pipeline per stage count p = 2, 4, … (p divides the GPUs, at most the layers and micro-batches)."""
    found = []
    layers = blocks.groups[0].layers if blocks.groups else 1
    p = 2
    while p <= min(layers, micro_batches, cluster.num_gpus):
        shape = stage_shape(cluster, cluster.num_gpus // p) if cluster.num_gpus % p == 0 else None
        if shape is not None:
            problem = build(fl, blocks, sub_mesh(cluster, shape), DEFAULT)
            best = _stage_plan(problem, limit, p, micro_batches)
            if best is not None:
                found.append(best)
        p *= 2
    return found


def _stage_plan(problem: Problem, limit: float, stages: int, micro_batches: int) -> Pipeline | None:
    """The intra-operator plan of one stage's sub-mesh, unconstrained first; if no slicing of it fits, again with
    the memory a first stage may hold (its layers' state is 1/p of the model's)."""
    accounting = Accounting(problem)
    free = plan(problem, float("inf"), micro_batches, accounting=accounting)
    found = pipeline(free, accounting, stages, micro_batches, limit)
    if found is not None or free.price is None:
        return found
    layers = problem.blocks.groups[0].layers if problem.blocks.groups else 1
    state = parts(free, accounting).layer_state
    tight = plan(problem, limit + layers * state * (1 - 1 / stages), micro_batches, accounting=accounting)
    return pipeline(tight, accounting, stages, micro_batches, limit)
