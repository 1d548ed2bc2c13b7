"""What would make a plan that does not fit in memory fit: its variants, each estimated again.

The variants change one option at a time the way the command line spells it (a higher ZeRO stage, more recompute,
twice the tensor- or pipeline-parallel size at half the data-parallel size, sequence parallelism, one sequence per
micro-batch, the optimizer on the host); when none of them fits, pairs of them. Each is checked
(``specs.check.check``) and priced by ``estimate`` under the same stack, so a hint's numbers are what ``estimate``
prints with its options; one the stack's framework does not run names the frameworks that do.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, fields
from itertools import combinations
from typing import TYPE_CHECKING, Any

from meshplan.report.fold import shell_command
from meshplan.specs.check import check
from meshplan.specs.layouts import layout_of
from meshplan.specs.plan import Plan
from meshplan.specs.stack import frameworks_running

if TYPE_CHECKING:
    from meshplan.estimate import Estimate

MAX_HINTS = 5
_FLAGS = {f.name: "--" + (f.metadata.get("flag") or f.name).replace("_", "-") for f in fields(Plan)}


@dataclass(frozen=True)
class FitHint:
    """One variant of the plan: its changed fields, the options that say them, and its estimate."""

    changes: dict[str, Any]
    est: Estimate
    runs: bool  # the stack's framework runs it

    @property
    def options(self) -> str:
        return " ".join(_option(k, v) for k, v in self.changes.items() if k not in ("etp", "summa_panels"))

    @property
    def frameworks(self) -> list[str]:
        """The framework presets that run the variant (all of them are listed only when the stack does not)."""
        return [] if self.runs else frameworks_running(self.est.plan, self.est.model)

    def to_dict(self) -> dict[str, Any]:
        return {"options": self.options, "changes": dict(self.changes), "fits": self.est.fits,
                "reasons": list(self.est.reasons), "peak_memory_bytes": self.est.peak_memory,
                "step_time_s": self.est.step_time, "framework_runs_it": self.runs,
                "frameworks": self.frameworks}


def _option(name: str, value: Any) -> str:
    flag = _FLAGS[name]
    if isinstance(value, bool):
        return flag if value else f"--no-{flag[2:]}"
    return f"{flag} {value}"


def variants(plan: Plan) -> list[dict[str, Any]]:
    """The single changes that lower memory per GPU, as Plan fields (the GPU count kept)."""
    out: list[dict[str, Any]] = [{"zero": z} for z in range(plan.zero + 1, 4)]
    out += [{"recompute": r} for r in {"none": ("selective", "full"), "selective": ("full",)}.get(plan.recompute, ())]
    if plan.dp % 2 == 0:
        wider = {"tp": 2 * plan.tp, "dp": plan.dp // 2}
        if layout_of(plan.tensor_layout).sequence_parallel and not plan.sequence_parallel:
            wider["sequence_parallel"] = True  # what the command line makes of tp > 1
        out += [wider, {"pp": 2 * plan.pp, "dp": plan.dp // 2}]
    if plan.tp > 1 and layout_of(plan.tensor_layout).sequence_parallel and not plan.sequence_parallel:
        out.append({"sequence_parallel": True})
    if plan.micro_batch > 1:
        out.append({"micro_batch": 1})
    if not plan.offload_optimizer:
        out.append({"offload_optimizer": True})
    return out


def _apply(plan: Plan, changes: dict[str, Any]) -> tuple[Plan, dict[str, Any]]:
    """The plan with ``changes``; fields that followed tp (etp, SUMMA panels) follow it still."""
    extra: dict[str, Any] = {}
    if "tp" in changes:
        extra |= {"etp": 0} if plan.etp == plan.tp else {}
        extra |= {"summa_panels": 0} if plan.summa_panels == max(plan.tp, plan.tp2) else {}
    return plan.with_(**changes, **extra), changes


def fit_hints(est: Estimate, limit: int = MAX_HINTS) -> list[FitHint]:
    """Up to ``limit`` variants of ``est``'s plan, those that fit first (fastest first, those its framework runs
    before those it does not), then the rest by memory; [] when the plan fits."""
    if est.fits:
        return []
    singles = variants(est.plan)
    hints = _priced(est, singles)
    if not any(h.est.fits for h in hints):
        pairs = [a | b for a, b in combinations(singles, 2) if not set(a) & set(b)]
        hints += _priced(est, pairs)
    hints.sort(key=lambda h: (not h.est.fits, not h.runs, h.est.step_time if h.est.fits else h.est.peak_memory))
    return hints[:limit]


def _priced(est: Estimate, changes: list[dict[str, Any]]) -> list[FitHint]:
    """The valid variants among ``changes``, each estimated under ``est``'s stack."""
    from meshplan.estimate import estimate as run

    out = []
    for change in changes:
        plan, shown = _apply(est.plan, change)
        if check(est.model, est.cluster, plan, est.stack):
            continue
        runs = est.stack.supports.runs(plan, est.model, est.stack)
        out.append(FitHint(shown, run(est.model, est.cluster, plan, est.stack), runs))
    return out


def hints_renderables(est: Estimate, hints: list[FitHint], width: int) -> list:
    """The hints as rich renderables fitting ``width``: what does not fit, a table of the variants and their
    legend."""
    from rich.text import Text

    from meshplan.report import terms
    from meshplan.report.fold import Col, folded_tables, headers, legend
    from meshplan.units import fmt_bytes, fmt_time

    out: list = [Text(f"does not fit ({'; '.join(est.reasons)}); " +
                      ("options that would change that:" if hints else "no single option changes that"),
                      style="bold red")]
    if hints:
        name = est.stack.name
        key = Col("options", [h.options for h in hints], "left", wrap=True)
        cols = [Col("memory", [fmt_bytes(h.est.peak_memory) for h in hints]),
                Col("step", [fmt_time(h.est.step_time) for h in hints]),
                Col("fits", ["yes" if h.est.fits else "no" for h in hints], "left"),
                Col("framework", [f"{name} runs it" if h.runs else
                                  f"not {name}; " + (", ".join(h.frameworks) or "no preset") + " run it"
                                  for h in hints], "left", wrap=True)]
        tables = folded_tables(f"what would make it fit ({len(hints)} of the variants, re-estimated)", key, cols,
                               width)
        out += [*tables, legend(terms.entries(headers(tables), units=False))]
    return out


def print_hints(est: Estimate, hints: list[FitHint], search: str, console) -> None:
    """The hints under the estimate's tables; the ``plan`` command line on one line (to copy)."""
    for renderable in hints_renderables(est, hints, console.width):
        console.print(renderable)
    console.print(shell_command("or search every plan:", shlex.split(search), console.width), soft_wrap=True,
                  markup=False, highlight=False)
