"""Size combinations: the valid (tp, tp2, cp, pp, dp, layout) of a space with their micro-batch, interleaving and
expert options, before placements; the invalid ones tallied with their reason (infeasible is a result).

An invalid combination is counted once per categorical setting it would have been paired with (``Combo.mult``): the
settings grid, times the two sequence-parallel options of a 1D layout with tp > 1.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from meshplan.search.keyed import panel_counts
from meshplan.search.space import Space
from meshplan.search.tally import Tally
from meshplan.specs.check import ring_window_reason
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec

# how far below the even split's ⌈L/p⌉ the search looks for a last-stage layer count (stage_options): the LM head and
# the loss weigh a few layers (Llama-3-8B's 128k-vocabulary head: about 2.4 layers' FLOPs)
UNEVEN_WINDOW = 4


@lru_cache(maxsize=4096)
def divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order, from the pairs (d, n / d) with d ≤ √n."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


@dataclass
class Combo:
    """One mesh of tp · cp · pp · dp with the settings its plans are paired with."""

    tp: int
    tp2: int
    cp: int
    pp: int
    dp: int
    layout: str
    mult: int  # categorical settings each of its plans is paired with
    micro: list[int]
    stages: list[tuple[int, int]]  # (vpp, last_stage_layers): the interleaving options, each with its stage splits
    experts: list[tuple[int, int]]  # (ep, etp)
    panel: int

    @property
    def sizes(self) -> int:
        """Its size rows: micro-batch × (interleaving, stage split) × expert options."""
        return len(self.micro) * len(self.stages) * len(self.experts)

    @property
    def unplaced(self) -> int:
        """Its plans before placements: the size rows × the categorical settings."""
        return self.mult * self.sizes


def valid_combos(model: ModelSpec, cluster: Cluster, space: Space) -> tuple[list[Combo], Tally]:
    """The valid (tp, tp2, cp, pp, dp, layout) combinations with their micro-batch, interleaving and expert
    options; the invalid ones tallied with their reason."""
    n, gbs, layers = cluster.num_gpus, space.global_batch, model.num_layers
    cat = space.grid_size
    tally, out = Tally(), []
    kept: dict[tuple[object, ...], Any] = {}  # what combinations of one tp, cp, pp or dp share: _options
    _tally_pins(n, space, tally)
    for tp, tp2, cp, pp, layout in _grids(n, space):
        dp = n // (tp * tp2 * cp * pp)
        if cp < space.cp_min or (space.cp_max and cp > space.cp_max) or dp not in space.keep("dp", [dp]):
            continue  # outside the space asked for, not a rejection
        mult = cat * (len(space.sequence_parallel) if tp > 1 and layout == "1d" else 1)
        if ("tensor", tp) not in kept:
            kept["tensor", tp] = _tensor_reason(model, tp)
        tensor: tuple[str, str] | None = kept["tensor", tp]
        reason = (tensor or _layout_reason(model, layout, tp2, cp)) if layout != "tp2d" \
            else (_layout_reason(model, layout, tp2, cp) or _tp2d_reason(model, tp, tp2))
        if reason is None and cp > 1 and model.seq_length % (2 * cp):
            reason = ("2*cp does not divide seq_length", f"cp={cp}, seq_length={model.seq_length}")
        if reason is None and ring_window_reason(model, cp, space.stack.cp_comm):
            reason = ("ring context parallelism with a sliding window",
                      f"cp={cp}, sliding_window={model.sliding_window}")
        if reason is None and layout != "1d" and not space.stack.projection_mode.on_grids:
            reason = (f"{layout}: fused projections only", f"projections={space.stack.projections}")
        if reason is None and pp > layers:
            reason = ("pp exceeds num_layers", f"pp={pp} > num_layers={layers}")
        if reason is None and model.per_layer_input and pp > 1:  # check.py: their inputs would travel with the sends
            reason = ("per-layer embeddings: pp=1 only", f"pp={pp} with {model.name}'s per-layer embeddings")
        if reason is None and gbs % dp:
            reason = ("dp does not divide global_batch", f"dp={dp} does not divide global_batch={gbs}")
        panels = panel_counts(model.hidden_size, tp, tp2) if layout == "summa" else [max(tp, tp2)]
        if reason is None and not panels:
            reason = ("no SUMMA panel count divides hidden_size", f"tp={tp}, tp2={tp2}")
        if reason is not None:
            tally.add(*reason, mult)
            continue
        micro, stages, experts, bad = _options(model, space, (tp, cp, pp, dp), kept)
        tally.add("ep*etp does not divide tp*cp*dp or num_experts", f"tp={tp} cp={cp} dp={dp}",
                  bad * mult * len(micro) * len(stages))
        if space.stack.overlap_ep:  # Megatron-Core's combined 1F1B (check.check): ep > 1, interleaved under a pipeline
            experts, stages = _ep_overlap_options(tally, experts, stages, pp, mult * len(micro))
        if micro and experts and stages:
            out.append(Combo(tp, tp2, cp, pp, dp, layout, mult, micro, stages, experts, panels[0]))
    if space.pinned and not out and not tally.counts:
        pins = " ".join(f"{a}={','.join(map(str, v))}" for a, v in space.pinned)
        tally.add("no plan has the pinned sizes", f"{pins} on {n} GPUs (dp = gpus / (tp·cp·pp)), global_batch={gbs}, "
                  f"max micro-batch {space.max_micro_batch}", cat)
    return out, tally


def _options(model: ModelSpec, space: Space, sizes: tuple[int, int, int, int], kept: dict[tuple[object, ...], Any]
             ) -> tuple[list[int], list[tuple[int, int]], list[tuple[int, int]], int]:
    """A valid combination's micro-batch sizes, (vpp, last-stage layers) pairs, (ep, etp) pairs and how many of those
    were not valid (``sizes``: tp, cp, pp, dp), each computed once per dp, pp and (tp, tp·cp·dp) they depend on
    (``kept``: valid_combos' memo; each combination given its own lists)."""
    tp, cp, pp, dp = sizes
    layers = model.num_layers
    if ("micro", dp) not in kept:
        kept["micro", dp] = space.keep("micro_batch", [b for b in divisors(space.global_batch // dp)
                                                       if b <= space.max_micro_batch])
    if ("stages", pp) not in kept:
        vpps = [1] + [v for v in divisors(layers // pp) if v > 1] * (pp > 1 and layers % pp == 0 and space.interleaving)
        kept["stages", pp] = stage_options(layers, pp, space.keep("vpp", vpps), space.uneven_stages)
    if ("experts", tp, tp * cp * dp) not in kept:
        experts, bad = _expert_pairs(model, tp, tp * cp * dp)
        kept["experts", tp, tp * cp * dp] = ([(e, t) for e, t in experts if e in space.axis_sizes("ep", [e])], bad)
    experts, bad = kept["experts", tp, tp * cp * dp]
    return list(kept["micro", dp]), list(kept["stages", pp]), list(experts), bad


def _tally_pins(n: int, space: Space, tally: Tally) -> None:
    """Pinned sizes of the GPU-count axes (tp, pp, cp, dp) that do not divide the GPU count: each a rejection with its
    reason (once per setting of the grid), left out of the enumeration (``_grids`` takes divisors only)."""
    for axis in ("tp", "pp", "cp", "dp"):
        for size in space.allowed(axis) or ():
            if n % size:
                tally.add(f"pinned {axis} does not divide the GPU count", f"{axis}={size}, gpus={n}", space.grid_size)


def stage_options(layers: int, pp: int, vpps: list[int], uneven: int) -> list[tuple[int, int]]:
    """(vpp, last_stage_layers) pairs: each interleaving option with the even split (0) and the ``uneven``
    (Space.uneven_stages) last-stage counts l nearest below ⌈L/p⌉, down to ⌈L/p⌉ − UNEVEN_WINDOW, that Megatron-Core
    lays out exactly (decoder_last_pipeline_num_layers): the other p − 1 ranks split L − l evenly and each rank's
    layers fill its v model chunks whole. Fewer layers only: the last rank also runs the LM head and the loss.
    Kept by its arguments (``_stage_options``): a space's combinations of one pp mostly share them (a strong-scaling
    sweep of llama3-70b over 8 GPU counts asks 2,171 times)."""
    return list(_stage_options(layers, pp, tuple(vpps), uneven))


@lru_cache(maxsize=256)
def _stage_options(layers: int, pp: int, vpps: tuple[int, ...], uneven: int) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    even = -(-layers // pp)
    for v in vpps:
        out.append((v, 0))
        if pp == 1 or not uneven:
            continue
        fits = [last for last in range(even - 1, max(1, even - UNEVEN_WINDOW) - 1, -1)
                if not (layers - last) % (pp - 1) and not (layers - last) // (pp - 1) % v and not last % v]
        out += [(v, last) for last in sorted(fits[:uneven])]
    return tuple(out)


def _grids(n: int, space: Space) -> Iterator[tuple[int, int, int, int, str]]:
    """(tp, tp2, cp, pp, layout) with tp·tp2·cp·pp dividing n: tp2 = 1 for 1D, tp2 >= 2 for SUMMA, tp and tp2 >= 2
    for tp2d (its tp = 1 grid is the 1D layout without sequence parallelism, its tp2 = 1 grid all-reduces every
    GEMM's output: neither searched)."""
    divs = divisors(n)
    for tp, cp, pp in itertools.product(*(space.axis_sizes(a, divs) for a in ("tp", "cp", "pp"))):
        if n % (tp * cp * pp):
            continue
        if "1d" in space.layouts:
            yield tp, 1, cp, pp, "1d"
        if "summa" in space.layouts:
            for tp2 in divisors(n // (tp * cp * pp))[1:]:
                yield tp, tp2, cp, pp, "summa"
        if "tp2d" in space.layouts and tp > 1:
            for tp2 in divisors(n // (tp * cp * pp))[1:]:
                yield tp, tp2, cp, pp, "tp2d"


def _tensor_reason(model: ModelSpec, tp: int) -> tuple[str, str] | None:
    if model.num_heads % tp:
        return "tp does not divide num_heads", f"tp={tp} does not divide num_heads={model.num_heads}"
    for kv in (model.num_kv_heads, model.window_kv_heads or model.num_kv_heads):
        if not model.is_mla and kv % tp and tp % kv:
            return "tp and num_kv_heads do not divide", f"tp={tp}, num_kv_heads={kv}"
    if model.ffn_hidden_size % tp:
        return "tp does not divide ffn_hidden_size", f"tp={tp} does not divide ffn={model.ffn_hidden_size}"
    if any(c in model.layer_pattern for c in "MP") and (model.mamba_heads % tp or model.mamba_groups % tp):
        return ("tp does not divide the Mamba heads and groups",
                f"tp={tp}, mamba_heads={model.mamba_heads}, mamba_groups={model.mamba_groups}")
    if "S" in model.layer_pattern and tp > 1:
        return "Mamba-1 blocks on one tp rank only", f"tp={tp} with {model.name}'s Mamba-1 blocks"
    if "R" in model.layer_pattern and model.lru_heads % tp:
        return "tp does not divide the RG-LRU gate blocks", f"tp={tp}, lru_heads={model.lru_heads}"
    if "C" in model.layer_pattern and model.hidden_size % tp:
        return "tp does not divide the short-convolution channels", f"tp={tp}, hidden={model.hidden_size}"
    if "L" in model.layer_pattern and model.num_heads % tp:
        return "tp does not divide the lightning-attention heads", f"tp={tp}, num_heads={model.num_heads}"
    if any(c in model.layer_pattern for c in "GK") and (model.gdn_key_heads % tp or model.gdn_value_heads % tp):
        return ("tp does not divide the Gated DeltaNet heads",
                f"tp={tp}, gdn_key_heads={model.gdn_key_heads}, gdn_value_heads={model.gdn_value_heads}")
    return None


def _tp2d_reason(model: ModelSpec, tp: int, tp2: int) -> tuple[str, str] | None:
    """The tp2d grid's divisibility (check._check_tp2d): h over tp; the heads, K/V heads and FFN over tp2."""
    if model.hidden_size % tp:
        return "tp2d: tp does not divide hidden_size", f"tp={tp}, hidden={model.hidden_size}"
    if model.num_heads % tp2 or model.num_kv_heads % tp2 or model.ffn_hidden_size % tp2:
        return ("tp2d: tp2 does not divide the heads, K/V heads or FFN size",
                f"tp2={tp2}, heads={model.num_heads}, kv_heads={model.num_kv_heads}, ffn={model.ffn_hidden_size}")
    return None


def _layout_reason(model: ModelSpec, layout: str, tp2: int, cp: int) -> tuple[str, str] | None:
    if model.index_topk and (cp > 1 or layout != "1d"):
        return "DeepSeek Sparse Attention: cp=1, 1d only", f"cp={cp}, layout={layout}"
    if model.diff_attention and layout != "1d":
        return "differential attention: 1d only", f"layout={layout}"
    if model.per_layer_input and layout != "1d":  # check.py: the per-layer embeddings are costed in the 1d layout
        return "per-layer embeddings: 1d only", f"layout={layout}"
    if model.is_hybrid and any(c in model.layer_pattern for c in "MGSKLPRC") and cp > 1:
        return "cp of Mamba layers not modelled", f"cp={cp} with {model.name}'s Mamba blocks"
    if layout == "1d":
        return None
    if model.is_hybrid:
        return f"{layout}: not for hybrid models", f"{model.name} has a layer_pattern"
    if model.is_moe or model.is_mla:
        return f"{layout}: dense standard-attention models only", f"{model.name} is MoE or MLA"
    if layout == "tp2d":
        return None  # its tp2 splits features, checked with tp (_tp2d_reason)
    if model.seq_length % (tp2 * cp):
        return "tp2*cp does not divide seq_length", f"tp2={tp2}, cp={cp}, seq_length={model.seq_length}"
    if model.hidden_size % tp2 or model.ffn_hidden_size % tp2:
        return "tp2 does not divide the hidden or FFN size", f"tp2={tp2}, hidden={model.hidden_size}"
    return None


def _expert_pairs(model: ModelSpec, tp: int, ranks: int) -> tuple[list[tuple[int, int]], int]:
    """(ep, etp) pairs that are valid, and how many were not."""
    if not model.is_moe:
        return [(1, tp)], 0
    pairs, bad = [], 0
    for ep in divisors(model.num_experts):
        for etp in divisors(tp):
            if ranks % (ep * etp) or model.moe_ffn_hidden_size % etp:
                bad += 1
            else:
                pairs.append((ep, etp))
    return pairs, bad


def _ep_overlap_options(tally: Tally, experts: list[tuple[int, int]], stages: list[tuple[int, int]], pp: int,
                        per: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The expert and (interleaving, stage split) options a stack that overlaps the EP all-to-alls (Stack.overlap_ep)
    can run: ep > 1, and with a pipeline an interleaved schedule; the others tallied (``per`` plans each)."""
    kept_experts = [(e, t) for e, t in experts if e > 1]
    kept_stages = [s for s in stages if s[0] > 1] if pp > 1 else stages
    tally.add("overlap_ep needs ep > 1", f"pp={pp}", (len(experts) - len(kept_experts)) * len(stages) * per)
    tally.add("overlap_ep needs vpp > 1 with pp > 1", f"pp={pp}",
              len(kept_experts) * (len(stages) - len(kept_stages)) * per)
    return kept_experts, kept_stages
