"""The sharding planner end to end: a model (a preset, a Hugging Face config.json or ``module.py:factory``) traced on
fake tensors, its intra-operator plan on the cluster's mesh, and pipeline slicings over sub-meshes; the fastest
plan that fits wins.

Inputs: a factory gets the ``--input-shape`` tensors; a preset or config.json gets token ids of shape (global batch /
micro-batches, sequence). Pipelines keep the traced micro-batch: from 2 stages up to the micro-batches per step
(1F1B needs at least as many micro-batches as stages), on sub-meshes of the sizes aligned to the tiers, sliced by
Alpa's DP (stage_dp.py, stages.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from meshplan.autoshard import trace_cache
from meshplan.autoshard.blocks import find_blocks
from meshplan.autoshard.dataflow import flow
from meshplan.autoshard.memory import Accounting
from meshplan.autoshard.mesh import device_mesh, sub_mesh
from meshplan.autoshard.problem import build_problem
from meshplan.autoshard.solve import Sharding, collector_paused, plan
from meshplan.autoshard.stage_dp import Option, sizes, slice_stages
from meshplan.autoshard.stages import Pipeline, StageParts, option, parts, price_slicing
from meshplan.errors import SpecError
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import Cluster, load_system
from meshplan.specs.hub_cache import cached_config, is_hub_id
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_load import CONFIG_SEQ_LENGTH, load_model, preset_names
from meshplan.specs.plan import OPTIMIZERS
from meshplan.specs.stack import load_stack

STAGE_MODES = ("off", "auto", "search")


@dataclass(frozen=True, kw_only=True)
class Request:
    model: str
    system: str = "h100"
    gpus: int = 8
    input_shapes: tuple[tuple[int, ...], ...] = ()  # a factory's inputs
    dtypes: tuple[str, ...] = ()  # none: trace.command.input_dtypes decides from the model
    param_dtype: str | None = "bfloat16"
    global_batch: int | None = None  # a preset's or config's sequences per step (default: one per GPU)
    seq: int | None = None
    micro_batches: int = 1
    mesh: tuple[int, ...] | None = None
    headroom: float = 0.0  # share of HBM left free
    stages: str = "auto"  # off | auto (only when one stage does not fit) | search
    nvlink_domain: int | None = None
    optimizer: str = "adam"  # as Plan.optimizer names it: its state and step (memory.OPTIMIZER_STATE)
    # host seconds per launched kernel on an x86 DGX host (--host-dispatch); None: eager PyTorch's (EAGER_HOST)
    host_dispatch: float | None = None


# The traced step runs as eager PyTorch, each aten op's kernels issued from Python: the plain-PyTorch stack preset's
# host cost per kernel (pytorch-fsdp: a plain-PyTorch layer's measured per-kernel host time, specs/stack.py), paid at
# the cluster's host speed (Cluster.python_host)
EAGER_HOST = load_stack("pytorch-fsdp").host_dispatch


def kernel_host(request: Request, cluster: Cluster) -> float:
    """Host seconds per launched kernel of the traced step on this cluster's host (problem.host_seconds)."""
    per_kernel = EAGER_HOST if request.host_dispatch is None else request.host_dispatch
    return per_kernel * cluster.python_host


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
    name = ref.split("/")[1] if is_hub_id(ref) else ""
    if name:  # a Hub id: its config.json in the local Hugging Face cache
        ref = str(cached_config(ref))
    if ref.endswith(".json"):
        from meshplan.autoshard.models import depth, hf_model, read_config

        config = read_config(ref)
        load_model(ref)  # refused here, before torch builds it, what meshplan's own import refuses (one line)
        context = int(config.get("max_position_embeddings") or config.get("n_positions") or 2048)
        seq = request.seq or min(context, CONFIG_SEQ_LENGTH)  # a config.json's training length (model_load.py)
        return hf_model(config), _ids(request, seq), name or Path(ref).parent.name or Path(ref).stem, depth(config)
    if ref in preset_names() or ref.endswith(".toml"):
        built = own_preset(request)
        if built is None:
            from meshplan.autoshard.models import hf_model, preset_config

            spec = load_model(ref)
            return hf_model(preset_config(spec)), _ids(request, request.seq or spec.seq_length), spec.name, \
                spec.num_layers
        from meshplan.autoshard.torch_models import build_preset

        spec, layers, inputs = built
        return build_preset(spec, layers), inputs, spec.name, spec.num_layers
    from meshplan.trace.command import build_from_factory, input_dtypes, load_factory

    if not request.input_shapes:
        raise SpecError("input-shape is required for a MODULE:FACTORY model (e.g. --input-shape 8x1024)")
    module = build_from_factory(load_factory(ref), ref)
    inputs = input_dtypes(module, list(request.input_shapes), request.dtypes, request.param_dtype)
    return module, inputs, type(module).__name__, None


def own_preset(request: Request) -> tuple[ModelSpec, int, list] | None:
    """A preset that torch_models.py builds: its spec as built (the sequence the longer of its own and the
    request's), the layers traced and the inputs; None for any other model."""
    if is_hub_id(request.model) or request.model.endswith(".json"):
        return None
    if request.model not in preset_names() and not request.model.endswith(".toml"):
        return None
    from meshplan.autoshard.models import TRACED_LAYERS, supported

    spec = load_model(request.model)
    if not supported(spec):
        return None
    seq = request.seq or spec.seq_length
    return replace(spec, seq_length=max(spec.seq_length, seq)), min(TRACED_LAYERS, spec.num_layers), _ids(request, seq)


def _ids(request: Request, seq: int) -> list:
    batch = request.global_batch or request.gpus
    if batch % request.micro_batches:
        raise SpecError(f"global-batch={batch} must be a multiple of micro-batches={request.micro_batches}")
    return [((batch // request.micro_batches, seq), "int64")]


def plan_sharding(request: Request) -> Result:
    """Trace, plan on the whole mesh, and (``stages``) on sub-meshes as pipelines; see the module docstring."""
    if request.stages not in STAGE_MODES:
        raise SpecError(f"stages={request.stages!r} must be one of {', '.join(STAGE_MODES)}")
    if request.optimizer not in OPTIMIZERS:
        raise SpecError(f"optimizer={request.optimizer!r} must be one of {', '.join(OPTIMIZERS)}")
    timings: dict[str, float] = {}
    clock = time.perf_counter()
    system = load_system(request.system)
    net = {"nvlink_domain": request.nvlink_domain} if request.nvlink_domain else {}
    cluster = system.cluster(request.gpus, **net)
    mesh = device_mesh(cluster, request.mesh)  # a bad mesh is refused before anything is traced
    trace, module, name, full = _traced(request, timings)
    if trace.params == 0:  # nothing to place: the ILP has no variable (``meshplan trace`` still times it)
        raise SpecError(f"model={request.model!r} has no parameters: the sharding planner places parameters "
                        "(meshplan trace times a module without any)")
    with collector_paused():
        clock = time.perf_counter()
        blocks = find_blocks(trace, layers=full)
        fl = flow(trace, blocks.block_of)
        host = kernel_host(request, cluster)
        problem = build_problem(fl, blocks, mesh, DEFAULT, request.optimizer, host)
        timings["graph"] = time.perf_counter() - clock
        limit = cluster.accelerator.hbm_bytes * (1 - request.headroom)
        clock = time.perf_counter()
        intra = plan(problem, limit, request.micro_batches)
        timings["intra-op solve"] = time.perf_counter() - clock
        clock = time.perf_counter()
        pipelines: tuple[Pipeline, ...] = ()
        if request.stages == "search" or (request.stages == "auto" and not intra.fits):
            pipelines = tuple(_pipelines(fl, blocks, cluster, limit, request.micro_batches, request.optimizer, host))
        timings["stages"] = time.perf_counter() - clock
    layers = blocks.groups[0].layers if blocks.groups else 1
    return Result(request=request, name=name, params=_full_params(request, trace, module, blocks),
                  layers=layers, traced_layers=blocks.groups[0].traced if blocks.groups else 1, cluster=cluster,
                  intra=intra, pipelines=pipelines, timings=timings)


def _traced(request: Request, timings: dict[str, float]) -> tuple[Any, Any, str, int | None]:
    """(trace, module, name, full depth) of the request's model: a preset's trace kept from an earlier run where
    there is one (trace_cache.py; the module then None), else the model built and traced (and a preset's kept)."""
    clock = time.perf_counter()
    own = own_preset(request)
    key = trace_cache.preset_key(own[0], own[1], own[2], request.param_dtype) if own is not None else None
    trace = trace_cache.load_trace(key) if key is not None else None
    if own is not None and trace is not None:
        timings["trace (kept)"] = time.perf_counter() - clock
        return trace, None, own[0].name, own[0].num_layers
    module, inputs, name, full = load(request)
    timings["build model"] = time.perf_counter() - clock
    clock = time.perf_counter()
    trace = _trace(module, inputs, request)
    timings["trace"] = time.perf_counter() - clock
    if key is not None:
        trace_cache.save_trace(key, trace)
    return trace, module, name, full


def _trace(module: Any, inputs: list, request: Request) -> Any:
    """The trace, a model that fails on its inputs being one line (as ``meshplan trace`` says it)."""
    import logging

    from meshplan.trace import trace_module
    from meshplan.trace.command import user_code

    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    level = fake_log.level
    fake_log.setLevel(logging.CRITICAL)
    try:
        with user_code():
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


def _full_params(request: Request, trace: Any, module: Any, blocks: Any) -> int:
    """The whole model's parameters: a preset's count, else the trace's plus, for a model traced with fewer blocks
    than it has (a config.json at depth 2), each missing block's parameters (issue 48: an 8B config.json read
    "1.49 B params", its two traced layers and embeddings)."""
    if request.model in preset_names() or request.model.endswith(".toml"):
        return load_model(request.model).params()
    extra = 0
    for group in blocks.groups:
        if group.layers <= group.traced:
            continue
        first = trace.ops[group.blocks[0][0]].module[len(group.prefix):]  # ".0.self_attn.q_proj"
        block = f"{group.prefix}.{first.lstrip('.').split('.')[0]}."
        per_block = sum(p.numel() for n, p in module.named_parameters() if n.startswith(block))
        extra += (group.layers - group.traced) * per_block
    return trace.params + extra


def _pipelines(fl: Any, blocks: Any, cluster: Cluster, limit: float, micro_batches: int, optimizer: str = "adam",
               host: float = 0.0) -> list[Pipeline]:
    """The best pipeline of each stage count stage_dp finds (p from 2 to the layers and micro-batches: 1F1B needs
    as many micro-batches as stages), stages on sub-meshes of the sizes aligned to the tiers, each size's plan
    solved once without a memory limit; if no slicing fits, again with the plans priced for memory (a stage on n of
    the G GPUs holding about n/G of the layers' state)."""
    layers = blocks.groups[0].layers if blocks.groups else 1
    if min(layers, micro_batches) < 2:
        return []
    plans = stage_plans(fl, blocks, cluster, micro_batches, optimizer=optimizer, host=host)
    found = slice_stages(sub_mesh_options(plans), layers, cluster.num_gpus, micro_batches, limit)
    if not found:
        plans |= stage_plans(fl, blocks, cluster, micro_batches, limit, plans, optimizer, host)
        found = slice_stages(sub_mesh_options(plans), layers, cluster.num_gpus, micro_batches, limit)
    return [price_slicing(s, plans, micro_batches, limit, cluster) for _, s in sorted(found.items())]


StagePlans = dict[int, tuple[StageParts, Sharding]]  # sub-mesh GPUs (negative: priced for memory) -> its plan's parts


def stage_plans(fl: Any, blocks: Any, cluster: Cluster, micro_batches: int, limit: float | None = None,
                free: StagePlans | None = None, optimizer: str = "adam", host: float = 0.0) -> StagePlans:
    """The intra-operator plan of every sub-mesh a stage may take (stage_dp.sizes, the whole cluster apart): without
    a memory limit, or (``limit`` and the ``free`` plans given) priced for a stage on n of the G GPUs holding about
    n/G of the layers (keys -n)."""
    layers = blocks.groups[0].layers if blocks.groups else 1
    found: StagePlans = {}
    for n, shape in sizes(cluster).items():
        if n == cluster.num_gpus or (free is not None and n not in free):
            continue
        problem = build_problem(fl, blocks, sub_mesh(cluster, shape), DEFAULT, optimizer, host)
        accounting = Accounting(problem)
        if free is None:
            budget, key = float("inf"), n
        else:
            assert limit is not None  # given with the free plans
            budget, key = limit + layers * free[n][0].layer_state * (1 - n / cluster.num_gpus), -n
        sharding = plan(problem, budget, micro_batches, accounting=accounting)
        if sharding.price is not None:
            found[key] = (parts(sharding, accounting), sharding)
    return found


def sub_mesh_options(plans: StagePlans) -> list[Option]:
    """stage_dp's options, one per plan."""
    return [option(part, sharding.problem.mesh.devices, sharding.problem.mesh.sizes, key)
            for key, (part, sharding) in plans.items()]
