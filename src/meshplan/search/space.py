"""Space: what the search may choose, and the settings every plan of it shares.

All factorisations N = dp·tp·pp·cp (tp·tp2 on the SUMMA grid); every divisor micro-batch; virtual stages v dividing
the layers per stage (interleaved when v > 1), each with the even split of the layers and an uneven one (a last stage
with fewer layers, Plan.last_stage_layers, where the framework runs it); ep dividing the experts and etp dividing tp;
ZeRO 0–3; recompute none / selective / full; sequence parallelism on / off (when tp > 1); optimizer / activation
offload; and every distinct placement of the axes on the mesh (which axes share the NVLink domain). Each size
combination is scored under the settings grid (recompute × ZeRO × optimizer offload × activation offload) at once.

The defaults are the command line's (``meshplan plan`` derives its options' defaults from these fields): the stack of
``stack.DEFAULT_FRAMEWORK`` (Megatron-Core, whose ``supports`` narrow the space to what it runs), the memory headroom
``fields.MEMORY_HEADROOM`` and the simplest plan first among those the error band cannot tell apart; so
``search(model, cluster, Space(global_batch=512))`` ranks first the plan ``meshplan plan`` ranks first.
``Space(..., stack=Stack(), headroom=0, prefer_simple=False)`` searches every plan meshplan models, by time alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from meshplan.errors import SpecError
from meshplan.fields import MAX_PLANS, MEMORY_HEADROOM
from meshplan.pipeline.registry import by_family, gpipe, interleaving, searched
from meshplan.ranges import check_options
from meshplan.specs.check import recompute_modules_problem
from meshplan.specs.plan import OPTIMIZERS, PINNABLE
from meshplan.specs.stack import FRAMEWORK_STACK, Stack, stack_modules

if TYPE_CHECKING:
    from meshplan.specs.model import ModelSpec


@dataclass(frozen=True, kw_only=True)
class Space:
    """What the search may choose. Environment settings (precision, overlap, gradient bytes, optimizer) are fixed."""

    global_batch: int
    zero: tuple[int, ...] = (0, 1, 2, 3)
    recompute: tuple[str, ...] = ("none", "selective", "full")
    recompute_modules: tuple[str, ...] = ("core_attn",)  # Plan.recompute_modules: what "selective" recomputes
    sequence_parallel: tuple[bool, ...] = (False, True)
    layouts: tuple[str, ...] = ("1d", "summa", "tp2d")
    cp_min: int = 1  # context-parallel sizes considered (a strategy comparison pins them)
    cp_max: int = 0  # 0: no limit
    offload_optimizer: tuple[bool, ...] = (False, True)
    offload_activations: tuple[bool, ...] = (False, True)
    # uneven splits tried beside each even pipeline split: the last stage with fewer layers, this many counts nearest
    # below the even one (combos.stage_options; each adds a size row per pp > 1 combination: 1 costs the search about a
    # quarter more time, 2 about a half); 0, or a stack without uneven stages: even splits only
    uneven_stages: int = 1
    # the stage DP (search/stage_dp.py): the fastest pipelined plans (of the search's POOL fastest, whatever the
    # number listed) refined with a layer count and a setting per pipeline rank where the framework runs that
    # (Supports.stage_layers); off by default (``meshplan plan`` turns it on: --per-stage), so that the search's
    # ranking is that of the uniform plans
    stage_layers: bool = False
    # MoE expert GEMMs searched as a plan choice (Stack.expert_gemm: per_expert, grouped), those the framework runs
    # (Supports.expert_gemms): each a search of its own, the fastest kept (search/variants.py); (): the stack's own
    expert_gemms: tuple[str, ...] = ()
    gpipe: bool = False  # GPipe: the step time of 1F1B with at least its memory (dominated; see search.run)
    # the asynchronous schedules (pipedream, pipedream-2bw: stale weights, so never searched unless asked for), those
    # of them the stack's framework runs (only ``--framework any`` / generic: no framework preset runs them)
    async_pipeline: bool = False
    # the split-backward schedules (zb-h1, dualpipe: zero_bubble.py), those of them the framework runs (only
    # ``--framework any`` / generic: no framework preset runs them with one chunk per rank); off by default
    split_backward: bool = False
    all_placements: bool = True
    max_micro_batch: int = 64
    precision: str = "bf16"
    grad_bytes: int = 4
    optimizer: str = "adam"  # Plan.optimizer: a training choice every plan of the space shares, not searched
    # how the software stack runs every plan (stack.py): its kernels, runtime, overlap, and which plans it runs (its
    # ``supports`` narrow the space); default: stack.DEFAULT_FRAMEWORK, Megatron-Core, as on the command line
    stack: Stack = FRAMEWORK_STACK
    # the most plans a search space may hold (``limits.plan_count``); a larger one is refused before any is built
    # (fields.MAX_PLANS); 0: no limit
    max_plans: int = MAX_PLANS
    # the share of HBM a plan must leave free: the model's largest memory error (fields.MEMORY_HEADROOM); 0: fill it
    headroom: float = MEMORY_HEADROOM
    # among plans whose step times the error band cannot tell apart (specs/bands.py), rank the simpler and lighter
    # first (fewer parallel axes and offloads, less memory) after the fastest, which leads (search/select.py);
    # False: by time alone
    prefer_simple: bool = True
    # with prefer_simple, the simplest of the band leads instead of the fastest (issue 36's rule; a faster machine
    # can then make #1 slower: search/select.py)
    simplest_leads: bool = False
    # the sizes the search keeps to, per axis of PINNABLE ((axis, sizes) pairs: ``meshplan plan --tp 4,8``); an axis
    # not named: every size the search enumerates. A pinned size that no plan can take is a rejection with its reason
    # (combos.valid_combos), not an error
    pinned: tuple[tuple[str, tuple[int, ...]], ...] = ()
    # partial full recompute and partial activation offload, shared by every plan of the space (Plan.recompute_layers,
    # Plan.offload_layers: Megatron-Core's --recompute-method block --recompute-num-layers and
    # cpu_offloading_num_layers): the layers per stage under the "full" recompute setting and under activation
    # offload; 0: all of them. A stage with fewer layers recomputes (offloads) all of its own
    recompute_layers: int = 0
    offload_layers: int = 0
    # options beyond the settings grid, each searched as a variant of every plan (``variants``: the search's time grows
    # with their product, so each defaults to off): the data-parallel exchange (Plan.dp_mode, with ``servers``
    # parameter-server shards), weight offload (Plan.offload_weights), the collective algorithms (Plan.collectives)
    dp_modes: tuple[str, ...] = ("allreduce",)
    servers: int = 0
    offload_weights: tuple[bool, ...] = (False,)
    collectives: tuple[str, ...] = ("nccl",)

    def __post_init__(self) -> None:
        check_options(max_micro_batch=self.max_micro_batch, max_plans=self.max_plans or None,  # ranges.RANGES
                      grad_bytes=self.grad_bytes, headroom=self.headroom,
                      recompute_layers=self.recompute_layers or None, offload_layers=self.offload_layers or None)
        if self.simplest_leads and not self.prefer_simple:  # sweep, report's scaling and --fastest-first rank by time
            raise SpecError("simplest_first=true lets the simplest plan of the error band lead, but this ranking is "
                            "by step time alone (sweep, report's scaling curve, --fastest-first): leave it out")
        if not isinstance(self.uneven_stages, int) or self.uneven_stages < 0:
            raise SpecError(f"uneven_stages={self.uneven_stages!r} must be a count of last-stage splits, 0 or more")
        problem = recompute_modules_problem(self.recompute_modules)
        if problem:
            raise SpecError(f"recompute_modules={_shown(self.recompute_modules)} {problem}")
        for axis, sizes in self.pinned:
            if axis not in PINNABLE or not sizes or min(sizes) < 1:
                raise SpecError(f"pinned {axis}={sizes!r}: pin positive sizes of {', '.join(PINNABLE)}")
        if self.optimizer not in OPTIMIZERS:
            raise SpecError(f"optimizer={self.optimizer!r} must be one of {', '.join(OPTIMIZERS)}")
        if min(self.recompute_layers, self.offload_layers) < 0:
            raise SpecError("recompute_layers and offload_layers must be counts of layers, 0 or more")
        self._no_effect()
        self._narrow_to_the_stack()

    def _no_effect(self) -> None:
        """A setting that the others leave without effect is refused rather than ignored."""
        for name, used, ok, what in (
                ("recompute_modules", self.recompute_modules != ("core_attn",), "selective" in self.recompute,
                 f"needs selective among recompute (got {','.join(self.recompute)})"),
                ("recompute_layers", self.recompute_layers > 0, "full" in self.recompute,
                 f"needs full among recompute (got {','.join(self.recompute)})"),
                ("offload_layers", self.offload_layers > 0, True in self.offload_activations,
                 "needs activation offload (offload_activations)"),
                ("servers", self.servers > 0, "ps" in self.dp_modes,
                 f"needs ps among dp_modes (got {','.join(self.dp_modes)})")):
            if used and not ok:
                raise SpecError(f"{name}={_shown(getattr(self, name))} {what}")

    def _narrow_to_the_stack(self) -> None:
        """Keep of each choice what the stack's framework runs (``Stack.supports``, and the ZeRO stages its FSDP has);
        refuse a space it leaves empty, an optimizer it does not run, asynchronous pipelines it has none of."""
        can, name = self.stack.supports, self.stack.name
        # FSDP's ZeRO-1 is its pipelined use (FsdpMode.has_zero), kept where the stack pipelines on a runtime that
        # holds FSDP's gradient sync to the last micro-batch; its pp = 1 plans are rejected with check's reason
        # (refusals.stack_refusals)
        piped = "pp" in can.axes and self.stack.pipeline_runtime_mode.fsdp_nosync
        zeros = tuple(z for z in can.zero if self.stack.fsdp_mode.has_zero(z, piped))
        narrowed = {"zero": tuple(z for z in self.zero if z in zeros),
                    "recompute": tuple(r for r in self.recompute if r in can.recompute),
                    "layouts": tuple(t for t in self.layouts if t in can.layouts),
                    "sequence_parallel": tuple(v for v in self.sequence_parallel if can.sequence_parallel or not v),
                    "offload_optimizer": tuple(v for v in self.offload_optimizer if can.offload_optimizer or not v),
                    "offload_activations": tuple(v for v in self.offload_activations
                                                 if can.offload_activations or not v),
                    "dp_modes": tuple(v for v in self.dp_modes if can.parameter_server or v != "ps"),
                    "offload_weights": tuple(v for v in self.offload_weights if can.offload_weights or not v),
                    "collectives": tuple(v for v in self.collectives if can.mst_collectives or v != "mst")}
        for field_name, values in narrowed.items():
            if not values:
                runs = {"zero": zeros, "dp_modes": ("allreduce", "ps")[:1 + can.parameter_server],
                        "collectives": ("nccl", "mst")[:1 + can.mst_collectives]}.get(
                    field_name, getattr(can, field_name, False))
                runs = ((False, True) if runs else (False,)) if isinstance(runs, bool) else runs
                fsdp = f" (fsdp={self.stack.fsdp})" if field_name == "zero" and self.stack.fsdp_mode.shards else ""
                raise SpecError(f"{field_name}={_shown(getattr(self, field_name))}: framework {name}{fsdp} runs none "
                                f"of them (it runs {field_name}={_shown(runs)})")
            object.__setattr__(self, field_name, values)
        if self.optimizer not in can.optimizers:
            raise SpecError(f"optimizer={self.optimizer}: framework {name} runs {', '.join(can.optimizers)} "
                            "(--framework any prices every optimizer)")
        if self.split_backward and not by_family("split", can.schedules):
            raise SpecError(f"split_backward: framework {name} runs the schedules {', '.join(can.schedules)}, none of "
                            f"{', '.join(by_family('split'))}: use --framework any")
        if self.async_pipeline and not by_family("async", can.schedules):
            raise SpecError(f"async_pipeline: framework {name} runs the schedules {', '.join(can.schedules)}, no "
                            f"asynchronous one ({', '.join(by_family('async'))}): use --framework any")
        if "selective" in self.recompute:
            object.__setattr__(self, "recompute_modules", stack_modules(self.recompute_modules, self.stack))
        object.__setattr__(self, "gpipe", self.gpipe and gpipe().name in can.schedules)
        object.__setattr__(self, "all_placements", self.all_placements and can.any_placement)
        object.__setattr__(self, "uneven_stages", self.uneven_stages if can.uneven_stages else 0)
        object.__setattr__(self, "stage_layers", self.stage_layers and can.stage_layers)
        object.__setattr__(self, "expert_gemms", tuple(g for g in self.expert_gemms if g in can.expert_gemms))
        if "cp" not in can.axes:
            object.__setattr__(self, "cp_max", 1)

    def axis_sizes(self, axis: str, sizes: list[int]) -> list[int]:
        """The sizes of ``axis`` (tp, pp, cp, ep) the stack's framework runs (all, or 1 where it lacks the axis)
        and the space keeps to (``pinned``)."""
        sizes = self.keep(axis, sizes)
        return sizes if axis in self.stack.supports.axes else [s for s in sizes if s == 1]

    def allowed(self, axis: str) -> tuple[int, ...] | None:
        """The sizes of ``axis`` the space is pinned to, None if any."""
        return dict(self.pinned).get(axis)

    def keep(self, axis: str, sizes: list[int]) -> list[int]:
        """Of ``sizes``, those ``axis`` may take (all where it is not pinned)."""
        allowed = self.allowed(axis)
        return sizes if allowed is None else [s for s in sizes if s in allowed]

    @property
    def async_schedules(self) -> tuple[str, ...]:
        """The asynchronous schedules searched: none unless ``async_pipeline``, then those the framework runs."""
        return by_family("async", self.stack.supports.schedules) if self.async_pipeline else ()

    @property
    def split_schedules(self) -> tuple[str, ...]:
        """The split-backward schedules searched: none unless ``split_backward``, then those the framework runs."""
        return by_family("split", self.stack.supports.schedules) if self.split_backward else ()

    @property
    def schedules(self) -> tuple[str, ...]:
        """The schedules searched, in the order the search scores them (pipeline/registry.searched)."""
        return searched(self.gpipe, self.async_schedules, self.split_schedules)

    @property
    def interleaving(self) -> bool:
        """Whether the framework runs the interleaved schedule (virtual pipeline stages)."""
        return interleaving().name in self.stack.supports.schedules

    @property
    def settings(self) -> dict[str, object]:
        """The plan fields every plan of the space shares."""
        return {"precision": self.precision, "grad_bytes": self.grad_bytes, "optimizer": self.optimizer,
                "recompute_modules": self.recompute_modules,
                "recompute_layers": self.recompute_layers, "offload_layers": self.offload_layers,
                "servers": self.servers}

    def variants(self) -> list[dict[str, object]]:
        """The options beyond the grid each plan is scored under (``dp_modes`` × ``offload_weights`` ×
        ``collectives``), as Plan fields; one empty variant when every one is off."""
        return [{k: v for k, v in (("dp_mode", d), ("offload_weights", w), ("collectives", c))
                 if v != {"dp_mode": "allreduce", "offload_weights": False, "collectives": "nccl"}[k]}
                for d in self.dp_modes for w in self.offload_weights for c in self.collectives]

    @property
    def grid(self) -> tuple[tuple, ...]:
        """The settings grid every size combination is scored under: (recompute, zero, offload opt, offload act)."""
        return (self.recompute, self.zero, self.offload_optimizer, self.offload_activations)

    @property
    def grid_size(self) -> int:
        return len(self.zero) * len(self.recompute) * len(self.offload_optimizer) * len(self.offload_activations)

    def modes(self) -> Iterator[tuple[str, bool]]:
        """(tensor layout, sequence parallelism) combinations; SP applies to the 1D layout only."""
        for layout in self.layouts:
            for sp in self.sequence_parallel if layout == "1d" else (False,):
                yield layout, sp


def _shown(value: object) -> str:
    """A setting as the command line writes it: a tuple comma-separated (on/off for sequence parallelism)."""
    if isinstance(value, tuple):
        return ",".join({True: "on", False: "off"}.get(v, str(v)) if isinstance(v, bool) else str(v) for v in value)
    return str(value)


def switch_spaces(model: ModelSpec, space: Space) -> list[Space]:
    """The spaces ``search_switches`` searches (search/variants.py): for a MoE model one per choice of
    ``space.expert_gemms``, its stack with that switch; else ``space`` on its stack (with the one choice, where there
    is one)."""
    choices = space.expert_gemms if model.is_moe else ()
    if len(choices) < 2:
        stack = space.stack.with_(expert_gemm=choices[0]) if choices else space.stack
        return [replace(space, stack=stack, expert_gemms=())]
    return [replace(space, stack=space.stack.with_(expert_gemm=g), expert_gemms=()) for g in choices]
