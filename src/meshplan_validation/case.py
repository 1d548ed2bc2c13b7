"""A published record → Case: its model (map_model.py), cluster (map_system.py), plan and stack (map_plan.py) and the
measured quantity to compare (measurement.py), with every assumption as a note; or a Skip whose reason names the
record's fields it is about.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from meshplan.errors import MeshplanError
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.units import GiB
from meshplan_validation.flops import flops_basis
from meshplan_validation.map_model import map_model, preset_by_name
from meshplan_validation.map_plan import map_plan
from meshplan_validation.map_system import hardware_section, map_cluster
from meshplan_validation.measurement import FLOP_METRICS, UNKNOWN_BASIS_NOTE, pick_metric
from meshplan_validation.recipes import mtp_layers
from meshplan_validation.record_fields import with_unread
from meshplan_validation.records import clean_record
from meshplan_validation.skip import Skip
from meshplan_validation.sources import source_defaults


@dataclass(frozen=True)
class Case:
    """A record mapped onto meshplan, with the quantity to compare."""

    id: str
    group: str
    model: ModelSpec
    cluster: Cluster
    plan: Plan
    stack: Stack
    metric: str
    measured: float
    assumptions: tuple[str, ...]
    basis: str = ""  # FLOP formula for tflops / mfu metrics
    measured_memory: float | None = None  # bytes
    memory_peak: str = "allocated"  # the counter it read (sources.SourceDefaults.memory_peak; evaluate.peak_read)

    @property
    def attention_kernel(self) -> str:
        return self.stack.attention_kernel

    def efficiency(self, eff: Efficiency = DEFAULT) -> Efficiency:
        """The efficiency model this run is evaluated with (the same for every run; the attention kernel family
        of its stack is a stack setting, ``Stack.attention_kernel``)."""
        return eff


# Hybrid Mamba models are costed block by block (mamba.mamba_block: the SSD kernels at their measured rate,
# efficiency.py ``ssd``) with their recipes' module recompute (recipes.RECOMPUTE) and multi-token prediction
# (recipes.mtp_layers). Those with a latent MoE (``moe_latent_size``: Nemotron 3 Super) are compared apart: with
# every documented setting of their recipes modelled they still read tens of percent off, fast on GB200 and slow on
# B200, for a cause not found (docs/ACCURACY.md, "Runs compared apart"). ``meshplan validate --hybrid`` compares
# them anyway; docs/ACCURACY.md lists that comparison apart from the summaries.
HYBRID_SKIP = ("{name}: hybrid Mamba-2 model with a latent MoE, compared apart (its runs read tens of percent off "
               "with every documented recipe setting modelled, a residual whose cause is not found; meshplan validate "
               "--hybrid compares it)")


def compared_apart(model: ModelSpec) -> bool:
    """A model whose runs ``map_run`` keeps out of the summaries unless asked (``HYBRID_SKIP``)."""
    return model.is_hybrid and model.moe_latent_size > 0


def map_run(record: dict[str, Any], hybrid: bool = False) -> Case:
    """Record → Case, or Skip with the reason (a model ``compared_apart`` unless ``hybrid``: HYBRID_SKIP). A reason
    names the record's fields it is about, and any of them whose stated value could not be read."""
    record = clean_record(record)
    try:
        return _map_run(record, hybrid)
    except Skip as exc:
        raise Skip(with_unread(str(exc), record)) from None


def _reading(section: str, fn: Any, *args: Any) -> Any:
    """``fn(*args)``, a record's section mapped: what a malformed value makes it raise becomes a Skip naming the
    section (an invalid size names its field, as specs' and plans' errors do)."""
    try:
        return fn(*args)
    except Skip:
        raise
    except MeshplanError as exc:
        raise Skip(f"{section}: {exc}") from exc
    except (ArithmeticError, LookupError, TypeError, ValueError) as exc:
        raise Skip(f"{section} not understood ({type(exc).__name__}: {exc})") from exc


def _map_run(record: dict[str, Any], hybrid: bool) -> Case:
    m = record.get("model") or {}
    _model_recorded(m)
    metric, value, basis = _reading("measured", pick_metric, record)
    model, notes = _reading("model", map_model, m, _architecture_text(record))
    model = _with_mtp(record, model, notes)
    if compared_apart(model) and not hybrid:
        raise Skip(HYBRID_SKIP.format(name=m.get("name")))
    notes += _measurement_notes(record, metric)
    hardware, implied = hardware_section(record)
    cluster, hw_notes = _reading("hardware", map_cluster, hardware)
    plan, stack, plan_notes = _reading("parallel", map_plan, record, model, cluster)
    if source_defaults(record).allreduce_table is not None:  # the source's own node, its all-reduce as measured
        cluster = replace(cluster, allreduce_table=source_defaults(record).allreduce_table)
    notes += hw_notes + implied + plan_notes
    if source_defaults(record).vocab_floor and plan.tp > 1:  # the source's model: V // tp rows a rank
        model = replace(model, vocab_size=model.vocab_size // plan.tp * plan.tp)
        notes.append(f"vocabulary {model.vocab_size}: the source's model holds vocab_size // tp rows a rank")
    if stack.attention_kernel == "fa2" and stack.flash_attention:
        notes.append(f"attention kernel: {stack.attention_kernel} class (the source's stack)")
    if record.get("_unread"):
        notes.append(f"values not read, taken as not stated: {', '.join(record['_unread'])}")
    memory = (record.get("measured") or {}).get("peak_memory_gib")
    usable = isinstance(memory, (int, float)) and 0 < memory < math.inf
    return Case(id=record["id"], group=str(record.get("group") or ""), model=model, cluster=cluster, plan=plan,
                stack=stack, metric=metric, measured=value, assumptions=tuple(notes), basis=basis,
                measured_memory=float(memory) * GiB if usable else None,
                memory_peak=source_defaults(record).memory_peak)


def _architecture_text(record: dict[str, Any]) -> str:
    """The sentences of a record's notes that describe its model's architecture (those naming it: "GPT architecture
    per ... : fused QKV with bias, ..."), which map_model reads for the fields that are not sizes; the other notes
    speak of the pricing, not of the model."""
    return " ".join(s for s in str(record.get("notes") or "").split(". ") if "architecture" in s.lower())


def _model_recorded(m: dict[str, Any]) -> None:
    """A Skip for a model section that gives neither sizes nor a preset's name."""
    if not m.get("name") and m.get("num_layers") is None:
        raise Skip("model not recorded: model.name and model.num_layers missing")
    name = str(m.get("name"))
    if m.get("arch") is None and m.get("num_layers") is None and preset_by_name(name) is None:
        missing = [f"model.{k}" for k in ("num_layers", "hidden_size", "num_heads") if m.get(k) is None]
        raise Skip(f"{name}: model sizes not recorded: {', '.join(missing)} missing and no preset named {name!r}")


def _with_mtp(record: dict[str, Any], model: ModelSpec, notes: list[str]) -> ModelSpec:
    """The model with the multi-token-prediction depths its stack trains (recipes.mtp_layers)."""
    mtp, mtp_note = mtp_layers(record, model)
    if mtp != model.mtp_layers:
        model = replace(model, mtp_layers=mtp, mtp_pattern=model.mtp_pattern if mtp else "",
                        mtp_shared=model.mtp_shared and bool(mtp))
    notes += [mtp_note] if mtp_note else []
    return model


def _measurement_notes(record: dict[str, Any], metric: str) -> list[str]:
    """Which field the compared quantity and the peak memory were read from, where not their own, and the FLOP
    basis assumed where the record names none."""
    read_from = record.get("_measured_from") or {}
    notes = [f"measured {k} read from {read_from[k]}" for k in (metric, "peak_memory_gib") if k in read_from]
    if metric in FLOP_METRICS and flops_basis(record) == "unknown":
        notes.append(UNKNOWN_BASIS_NOTE)
    return notes
