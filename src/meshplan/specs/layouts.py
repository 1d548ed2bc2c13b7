"""The tensor-parallel layouts (``Plan.tensor_layout``): one record per layout, each holding what the check, the cost
model, the configs and the report do differently under it; callers read the record (``layout_of``) and never compare
the layout's name (tests/test_pipeline_registry.py checks the core for such comparisons).

- ``1d``: Megatron's tensor parallelism (Shoeybi et al. 2019): tp splits the heads and the MLP's hidden size, with
  sequence parallelism (Korthikanti et al. 2022) an option, on by default.
- ``summa``: 2D SUMMA on a tp x tp2 grid (van de Geijn & Watts 1997; seed 003): tp2 splits the sequence and the
  weights' rows, panels split the hidden size (cost/summa.py).
- ``tp2d``: seed 001's weight-stationary tp_in x tp_out grid: h over tp (= tp_in), the heads and the MLP's hidden size
  over tp2 (= tp_out) (cost/tp2d.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class TensorLayout:
    """A tensor-parallel layout (module docstring)."""

    name: str
    # a tp x tp2 grid: tp2 > 1 allowed, every weight of the block split over tp·tp2 (cost/params.py), the residual
    # stream sharded over tp without sequence parallelism (cost/records.py), the layer priced by its own module
    # (cost/layers.py); dense standard-attention layers only (specs/check.py)
    grid: bool
    rows_split: bool  # tp2 splits the token rows (summa's sequence); tp2d's tp2 splits features
    heads_over_tp: bool  # tp splits the attention heads; tp2d's tp splits h only, its grid's columns repeat the heads
    sequence_parallel: bool  # sequence parallelism is an option, on by default where tp > 1 (Plan, the command line)
    sends_sharded: bool  # a pipeline stage's activations leave it split over tp without sequence parallelism
    panels: bool  # SUMMA's broadcast panels (Plan.summa_panels) apply
    in_frameworks: bool  # the frameworks' configs (Megatron, NeMo, torchtitan, DeepSpeed, verl, OpenRLHF) run it
    tp_text: str  # Plan.describe's tensor-parallel part, formatted with the plan's fields
    cell: str  # the report's tensor-parallel cell (dp·tp·pp·cp), formatted with the plan's fields
    # what the report's list of assumptions adds for it (report/trust.py): (assumption, where it is made)
    assumption: tuple[str, str] | None = None


TENSOR_LAYOUTS: dict[str, TensorLayout] = {t.name: t for t in (
    TensorLayout(name="1d", grid=False, rows_split=False, heads_over_tp=True, sequence_parallel=True,
                 sends_sharded=False, panels=False, in_frameworks=True, tp_text="tp={tp}", cell="{tp}"),
    TensorLayout(name="summa", grid=True, rows_split=True, heads_over_tp=True, sequence_parallel=False,
                 sends_sharded=True, panels=True, in_frameworks=False, tp_text="summa={tp}x{tp2}/nb{summa_panels}",
                 cell="{tp}x{tp2}", assumption=("activations stay in L2 between neighbouring kernels of the 2D layout "
                                                "(seed 003)", "cost/linear_2d.py")),
    TensorLayout(name="tp2d", grid=True, rows_split=False, heads_over_tp=False, sequence_parallel=False,
                 sends_sharded=False, panels=False, in_frameworks=False, tp_text="tp2d={tp}x{tp2}",
                 cell="{tp}x{tp2}w", assumption=("the tp ranks of a grid column repeat its attention heads; embedding "
                                                 "and LM head split over tp only", "cost/tp2d.py")),
)}
LAYOUT_NAMES = tuple(TENSOR_LAYOUTS)


def layout_of(name: str) -> TensorLayout:
    """The record of layout ``name``; a KeyError naming the known ones otherwise."""
    if name not in TENSOR_LAYOUTS:
        raise KeyError(f"tensor layout {name!r} is none of {', '.join(LAYOUT_NAMES)}")
    return TENSOR_LAYOUTS[name]


def names_where(**values: bool) -> tuple[str, ...]:
    """The layouts whose fields have ``values`` (``names_where(grid=True)``: the 2D layouts), for the messages that
    name them."""
    return tuple(t.name for t in TENSOR_LAYOUTS.values() if all(getattr(t, k) == v for k, v in values.items()))
