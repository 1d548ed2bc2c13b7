"""The search's options, defined once for ``plan``, ``sweep`` and ``report`` so that the three stay in step.

The pins (``--tp 8``, ``--pp 2,4``, ``--micro-batch 1,2`` …) and the partial recompute and offload counts are generated
from Plan's fields (their flag and help text: specs/plan.py), like ``estimate``'s plan options (options.py): a pin
keeps the search's enumeration to the sizes given (search/space.py ``Space.pinned``), it does not filter a top k.
``search_options`` adds them to a command; ``space_settings`` turns what was given into the fields of a ``Space``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from meshplan.cli.common import check_max_plans, choices, split_ints
from meshplan.cli.options import flag, recompute_modules
from meshplan.errors import SpecError
from meshplan.pipeline.registry import by_family, schedule_of
from meshplan.ranges import check_options
from meshplan.search.space import Space
from meshplan.specs.plan import COLLECTIVE_ALGORITHMS, DP_MODES, OPTIMIZERS, PINNABLE, PRECISION, Plan
from meshplan.specs.stack import Stack

_FIELDS = {f.name: f for f in dataclasses.fields(Plan)}
PIN_PREFIX = "pin_"
LAYER_COUNTS = ("recompute_layers", "offload_layers")  # Plan fields the search takes as one count for all its plans


def _space_default(name: str) -> Any:
    """The default of Space's field ``name``: the one an option not given stands for."""
    return next(f.default for f in dataclasses.fields(Space) if f.name == name)


def _listed(values: tuple) -> str:
    """A tuple of Space's as the option writes it: comma-separated, sequence parallelism as off / on."""
    return ",".join(("on" if v else "off") if isinstance(v, bool) else str(v) for v in values)


def _schedules(family: str) -> str:
    """The schedules of ``family`` (pipeline/registry.py) as the help names them: "a, b (vpp 2) and c"."""
    names = [f"{s}" + (f" (vpp {chunks})" if (chunks := schedule_of(s).chunks) > 1 else "") for s in by_family(family)]
    return " and ".join((", ".join(names[:-1]), names[-1])) if len(names) > 1 else "".join(names)


def _pin_option(name: str) -> Any:
    fld = _FIELDS[name]
    return click.option(flag(fld), PIN_PREFIX + name, default=None,
                        help=f"{fld.metadata['help']}: a size or a comma-separated list the search keeps to "
                             "(default: every size it enumerates)")


def _count_option(name: str) -> Any:
    fld = _FIELDS[name]
    return click.option(flag(fld), name, type=int, default=_space_default(name), show_default=True,
                        help=f"{fld.metadata['help']}; the search's plans with that setting take this count")


OPTIONS = [
    *(_pin_option(name) for name in PINNABLE),
    click.option("--zero", "zero_opts", default=_listed(_space_default("zero")), show_default=True,
                 help="ZeRO stages to consider"),
    click.option("--recompute", "recompute_opts", default=_listed(_space_default("recompute")), show_default=True,
                 help="activation recompute modes to consider"),
    click.option("--recompute-modules", "recompute_modules_text", default=_listed(_space_default("recompute_modules")),
                 show_default=True, help=_FIELDS["recompute_modules"].metadata["help"]),
    _count_option("recompute_layers"),
    click.option("--sp", "sp_opts", default=_listed(_space_default("sequence_parallel")), show_default=True,
                 help="sequence parallelism options"),
    click.option("--offload/--no-offload", default=True in _space_default("offload_optimizer"), show_default=True,
                 help="consider optimizer / activation offload"),
    _count_option("offload_layers"),
    click.option("--async-pipeline", is_flag=True, default=_space_default("async_pipeline"),
                 help=f"also search the asynchronous pipeline schedules {_schedules('async')} (stale weights: "
                      "not synchronous SGD; only --framework any or generic runs them)"),
    click.option("--split-backward", is_flag=True, default=_space_default("split_backward"),
                 help=f"also search the split-backward schedules {_schedules('split')} (only --framework any or "
                      "generic runs them)"),
    click.option("--placements", type=click.Choice(["all", "default"]),
                 default="all" if _space_default("all_placements") else "default", show_default=True,
                 help="every placement of the axes on the mesh, or tp,cp,dp,pp only"),
    click.option("--max-micro-batch", type=int, default=_space_default("max_micro_batch"), show_default=True),
    click.option("--max-plans", type=int, default=_space_default("max_plans"), show_default=True,
                 help="refuse a search space of more plans than this (0: no limit)"),
    click.option("--precision", type=click.Choice(PRECISION), default=None,
                 help="default: " + _FIELDS["precision"].metadata["default_help"]),
    click.option("--grad-bytes", type=int, default=_space_default("grad_bytes"), show_default=True,
                 help=_FIELDS["grad_bytes"].metadata["help"]),
    click.option("--optimizer", type=click.Choice(OPTIMIZERS), default=_space_default("optimizer"), show_default=True,
                 help=_FIELDS["optimizer"].metadata["help"] + "; every plan of the search keeps it (not searched)"),
    click.option("--dp-mode", "dp_mode_opts", default=_listed(_space_default("dp_modes")), show_default=True,
                 help="data-parallel exchanges to consider: allreduce, ps (a parameter server: seed 004; --framework "
                      "any or generic)"),
    click.option("--servers", type=int, default=_space_default("servers"), show_default=True,
                 help=_FIELDS["servers"].metadata["help"]),
    click.option("--offload-weights", is_flag=True, default=False,
                 help="also consider weights in host memory (ZeRO-Infinity; --framework any or generic)"),
    click.option("--collectives", "collectives_opts", default=_listed(_space_default("collectives")),
                 show_default=True, help="collective algorithms to consider: nccl, mst (also the minimum spanning "
                                         "tree where faster; --framework any or generic)"),
    click.option("--headroom", type=float, default=None,
                 help=f"share of HBM every plan leaves free (default: {_space_default('headroom'):g}, the model's "
                      "largest memory error against measured runs, docs/ACCURACY.md; sweep: 0); plans inside it are "
                      "listed as rejected"),
    click.option("--fastest-first", is_flag=True, default=False,
                 help="rank by step time alone (by default the fastest plan leads and the others within its error "
                      "band follow it, the simplest first)"),
    click.option("--simplest-first", is_flag=True, default=False,
                 help="let the simplest plan within the fastest's error band lead instead of the fastest (a faster "
                      "machine can then bring a simpler, slower plan into the band, and #1 gets slower)"),
]
NAMES = tuple(o(lambda: None).__click_params__[0].name for o in OPTIONS)  # the parameters, for the test


def search_options(f: Any) -> Any:
    """Add the search's options (``OPTIONS``) to a command."""
    for opt in reversed(OPTIONS):
        f = opt(f)
    return f


def pop_search_options(options: dict[str, Any]) -> dict[str, Any]:
    """The search options' values, removed from a command's ``options``."""
    return {name: options.pop(name) for name in NAMES}


def pins(given: dict[str, Any]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The pinned sizes (``Space.pinned``) of the options given, each checked against its range (ranges.RANGES)."""
    out = []
    for name in PINNABLE:
        text = given[PIN_PREFIX + name]
        if text is None:
            continue
        sizes = split_ints(text, name.replace("_", "-")) or []
        for size in sizes:
            check_options(**{name: size})
        out.append((name, tuple(sorted(set(sizes)))))
    return tuple(out)


def space_settings(given: dict[str, Any], stack: Stack, headroom: float | None = None) -> dict[str, Any]:
    """The fields of a ``Space`` from the search options (``pop_search_options``): the ZeRO stages, the recomputes and
    their modules, sequence parallelism, offload, placements, pins and limits; ``headroom``: the command's default
    share of HBM left free (None: Space's). The precision is None unless given (the GPU's own). What a space may not
    be (a setting without effect, one the framework does not run, a value out of range) is Space's to refuse."""
    check_max_plans(given["max_plans"])
    share = headroom if given["headroom"] is None else given["headroom"]
    zeros = tuple(int(z) for z in choices(given["zero_opts"], ("0", "1", "2", "3"), "zero"))
    sps = tuple(v == "on" for v in choices(given["sp_opts"], ("off", "on"), "sp"))
    recomputes = choices(given["recompute_opts"], ("none", "selective", "full"), "recompute")
    offload = (False, True) if given["offload"] else (False,)
    settings = {"async_pipeline": given["async_pipeline"], "split_backward": given["split_backward"], "zero": zeros,
                "recompute": recomputes,
                "recompute_modules": recompute_modules(given["recompute_modules_text"]), "sequence_parallel": sps,
                "offload_optimizer": offload, "offload_activations": offload,
                "all_placements": given["placements"] == "all", "max_micro_batch": given["max_micro_batch"],
                "precision": given["precision"], "grad_bytes": given["grad_bytes"], "optimizer": given["optimizer"],
                "max_plans": given["max_plans"], "pinned": pins(given), "recompute_layers": given["recompute_layers"],
                "offload_layers": given["offload_layers"], "servers": given["servers"],
                "dp_modes": choices(given["dp_mode_opts"], DP_MODES, "dp-mode"),
                "offload_weights": (False, True) if given["offload_weights"] else (False,),
                "collectives": choices(given["collectives_opts"], COLLECTIVE_ALGORITHMS, "collectives")}
    if given["fastest_first"] and given["simplest_first"]:
        raise SpecError("ranking=--fastest-first --simplest-first: give one of them (time alone, or the simplest of "
                        "the error band leading)")
    settings |= {"prefer_simple": False} if given["fastest_first"] else {}
    settings |= {"simplest_leads": True} if given["simplest_first"] else {}
    return settings | ({} if share is None else {"headroom": share})


def search_space(settings: dict[str, Any], global_batch: int, stack: Stack, precision: str, **extra: Any) -> Any:
    """The ``Space`` (search.Space) of ``space_settings``' fields, with ``precision`` (the GPU's own) unless one was
    given; ``extra``: the command's own fields (sweep's ``prefer_simple=False``)."""
    return Space(**({**settings, "precision": settings["precision"] or precision} | extra), global_batch=global_batch,
                 stack=stack)
