"""What every column header and abbreviation of the search tables means: the legends printed under them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from meshplan.pipeline.registry import interleaving

HEADERS = {
    "#": "rank, fastest first (ties: less memory)",
    "dp·tp·pp·cp": "data-, tensor-, pipeline-, context-parallel sizes",
    "ep/etp": "expert-parallel / expert-tensor-parallel sizes",
    "vpp": "virtual pipeline stages (model chunks) per pipeline rank",
    "first": "layers on the first pipeline stage, where the plan sets them apart (-: an even split; the search's #1 is "
             "refined so: search/refine.py)",
    "last": "layers on the last pipeline stage, where the plan sets them apart (-: an even split; shown when a "
            "plan does)",
    "layers": "decoder layers per pipeline rank, where a plan sets each rank's (N×k: k ranks of N; the stage DP, "
              "search/stage_dp.py; Megatron-Core's --pipeline-model-parallel-layout)",
    "mbs": "sequences per micro-batch",
    "schedule": "pipeline schedule (shown when a plan runs one searched only where asked for: pipedream, "
                "pipedream-2bw train on stale weights, with --async-pipeline; zb-h1, zb-v, dualpipe, chimera split "
                "the backward, with --split-backward)",
    "zero": "ZeRO stage (1 shards the optimizer state over dp, 2 also gradients, 3 also weights)",
    "recompute": "activations recomputed (selective: the attention core; full: whole layers; full N: N layers of "
                 "each rank); per pipeline rank where the ranks differ (sel, full, N: N layers full, -: none; "
                 "search/stage_settings.py)",
    "sp": "sequence parallelism",
    "offload": "held in host memory (opt: optimizer state and step; act: activations; act 3,1,0: layers per "
               "pipeline rank)",
    "in NVLink": "parallel groups inside one NVLink domain",
    "step": "predicted step time",
    "tokens/s": "tokens per second, whole cluster",
    "MFU": "model FLOPs utilization (model FLOP/s per GPU over its peak)",
    "memory": "peak memory per GPU",
    "goodput": "useful share of the wall time with failures at --mtbf, checkpoints every Young / Daly interval and "
               "restarts (goodput.py)",
    "days": "days to train on the token budget (with --mtbf: at that goodput)",
    "cost": "those GPU-hours times the price",
    "GPUs": "GPU count searched",
    "best plan": "the plan ranked first at that count: parallel sizes (dp= tp= pp= cp= ep= etp= vpp=), mbs, gbs "
                 "global batch, zero, recompute, sp, the pipeline schedule unless 1f1b, offload-opt / offload-act, "
                 "placement= the axes' order on the mesh, innermost first, where not the default",
    "evaluated": "plans checked for memory and timed",
    "reason": "why plans were rejected",
    "plans": "how many plans for that reason",
    "for example": "one of them",
    "options": "the estimate options that change the plan (the others as given)",
    "fits": "whether its peak memory per GPU fits in HBM",
    "framework": "whether the stack's framework runs the changed plan, else the presets that do",
}
NONE = ("-", "none or off")
UNITS = ("units", "k M B T = 10^3 10^6 10^9 10^12; KiB MiB GiB TiB = 2^10 2^20 2^30 2^40 bytes; ms, us = milli-, "
         "microseconds")
BAND = ("±N%", "the step time's error band (relative half-width)")  # ranked_training.band_entry shows the rows' own
EQUIVALENT = ("≈", "after a rank: step time within the fastest plan's ranking band (the dense runs' error band on this "
              "GPU: as fast, to the model's accuracy)")
# the ranking of a search that prefers simple plans (search/select.py), replacing HEADERS["#"]: the fastest leading
# (the default), or the simplest of the band (Space.simplest_leads)
_SIMPLER = ("the simplest first (fewest of: tp, pp, cp, ep, a second tp grid axis and interleaving (vpp) above 1, "
            "optimizer and activation offload, any recompute), then the lightest, then the fastest; the others after "
            "them, fastest first")
RANK_SIMPLE = ("rank: the fastest plan first, then the others within its ranking band, " + _SIMPLER)
RANK_GOODPUT = ("rank: by expected time with failures (--mtbf), the step over its goodput, least first "
                "(search/by_goodput.py)")
RANK_SIMPLEST = ("rank: the plans within the fastest plan's ranking band first, " + _SIMPLER)
BEST_SIMPLE = "the plan ranked first at that count (the simplest within the fastest plan's ranking band)"
SUMMA_CELL = ("4x2 as tp", "2D SUMMA tensor parallelism on a tp x tp2 grid of 4 x 2")
SUMMA_PLAN = ("summa=4x2/nb16", "2D SUMMA tensor parallelism on a 4 x 2 grid, broadcast in 16 panels")
TP2D_CELL = ("4x2w as tp", "2D weight-stationary tensor parallelism (seed 001's tp_in x tp_out) on a 4 x 2 grid")
TP2D_PLAN = ("tp2d=4x2", "2D weight-stationary tensor parallelism (seed 001): h over 4 GPUs, the heads and FFN over 2")
# the notes of the tensor layouts a table shows (specs/layouts.py): under the ranked table's cells, under the plans
LAYOUT_CELLS = {"summa": SUMMA_CELL, "tp2d": TP2D_CELL}
LAYOUT_PLANS = {"summa": SUMMA_PLAN, "tp2d": TP2D_PLAN}
REASONS = {
    "dominated: GPipe": "GPipe plans: 1F1B has their step time with less memory, so they are counted, not timed",
    "headroom": "the share of HBM every plan leaves free (--headroom)",
    interleaving().name: f"the {interleaving().title} pipeline schedule (vpp > 1)",
}


def entries(headers: Sequence[str], extra: Sequence[tuple[str, str]] = (), units: bool = True,
            blocks: Mapping[str, int] | None = None, meanings: Mapping[str, str] | None = None
            ) -> list[tuple[str, str]]:
    """(term, meaning) for each header shown, then the notations ``extra`` names, then the units. ``blocks``: the
    GPUs per block of each mesh tier's column ("in NVLink", "in <tier>": report.text.tier_headers)."""
    out, blocks = [], blocks or {}
    for h in headers:
        meaning = {**HEADERS, **(meanings or {})}.get(h, f"parallel groups inside one {h.removeprefix('in ')} block")
        if h in blocks:
            meaning += f" of {blocks[h]:,} GPUs"
        if h not in HEADERS:
            meaning += ", not inside one of the tier below"
        out.append((h, meaning))
    return out + list(extra) + ([UNITS] if units else [])


def reason_notes(reasons: Sequence[str]) -> list[tuple[str, str]]:
    """The notations that the rejection reasons shown use."""
    return [(term, meaning) for term, meaning in REASONS.items() if any(term in r for r in reasons)]
