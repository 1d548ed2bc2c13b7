"""The schedules' rules beside their bubble (registry.py binds one of each to every record): the forwards a rank runs
before its first backward (tables.build's tables), the activations a rank holds in flight, the weight versions it
keeps, the plan shapes it refuses (with the reason) and, for the search's batches, the rows it runs. Scalars or NumPy
arrays alike (``xp``), the warm-up counts integers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, overload

from meshplan.xp import Num, minimum


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanShape:
    """What a schedule's refusals read of a plan: its name, p, v, m (None where global_batch / (dp·micro_batch) is
    not whole: another check says so) and its uneven first and last stages' layers (0: even)."""

    schedule: str
    pp: int
    vpp: int
    m: int | None
    stage_layers: tuple[int, int] = (0, 0)  # first_stage_layers, last_stage_layers


# ---- warm-up: the forwards rank ``rank`` runs before its first backward, of p ranks, m micro-batches, v chunks a rank
# and groups of n micro-batches (tables.build; Megatron-Core 0.16.1 pipeline_parallel/schedules.py
# get_pp_rank_microbatches) ----------------------------------------------------------------------------------------
def all_warmup(pp: int, m: int, vpp: int, n: int, rank: int) -> int:
    """GPipe: every forward before any backward (Huang et al. 2019)."""
    return m


def line_warmup(pp: int, m: int, vpp: int, n: int, rank: int) -> int:
    """1F1B and the asynchronous schedules: min(p − r − 1, m) (Narayanan et al. 2021 §2.2.1; 2019 §3.2)."""
    return min(pp - rank - 1, m)


@overload
def interleaved_warmup(pp: int, m: int, vpp: int, n: int, rank: int) -> int: ...
@overload
def interleaved_warmup(pp: Num, m: Num, vpp: Num, n: Num, rank: Num) -> Num: ...
def interleaved_warmup(pp: Num, m: Num, vpp: Num, n: Num, rank: Num) -> Num:
    """Interleaved 1F1B: min(2·(p − r − 1) + (v − 1)·N, v·m) (Megatron-Core's warm-up over virtual micro-batches);
    ints for the table, arrays for the search (``interleaved_in_flight``)."""
    return minimum((pp - rank - 1) * 2 + (vpp - 1) * n, vpp * m)


# ---- activations in flight: model chunks whose activations rank ``rank`` holds at its peak ---------------------------
def line_in_flight(pp: Num, vpp: Num, m: Num, rank: Num) -> Num:
    """1F1B: min(p − r, m) (Narayanan et al. 2021 §2.2.1: rank r's p − r − 1 warm-up forwards, + 1)."""
    return minimum(pp - rank, m)


def all_in_flight(pp: Num, vpp: Num, m: Num, rank: Num) -> Num:
    """GPipe keeps all m."""
    return m


def interleaved_in_flight(pp: Num, vpp: Num, m: Num, rank: Num) -> Num:
    """Megatron-LM's interleaved warm-up (``interleaved_warmup``, groups of N = p) + 1, at most v·m."""
    return minimum(interleaved_warmup(pp, m, vpp, pp, rank) + 1, vpp * m)


def async_in_flight(pp: Num, vpp: Num, m: Num, rank: Num) -> Num:
    """PipeDream, 2BW: p − r (no flush: m does not bound it)."""
    return pp - rank


def zb_h1_in_flight(pp: Num, vpp: Num, m: Num, rank: Num) -> Num:
    """ZB-H1: every rank holds up to p between F and W (zero_bubble.build_zb_h1), its W residues counted whole:
    rank 0's is 1F1B's, the last rank's an upper bound."""
    return minimum(pp, m)


def dualpipe_in_flight(pp: Num, vpp: Num, m: Num, rank: Num) -> Num:
    """DualPipe: DeepSeek-V3 Table 2's PP + 1 micro-batches, every rank of dualpipe.build_dualpipe's table (F to W,
    m >= 2p)."""
    return minimum(pp + 1, m)


def zb_v_in_flight(pp: Num, vpp: Num, m: Num, rank: Num) -> Num:
    """ZB-V: 1F1B's p micro-batches of a whole stage: 2p half-stage chunks, F to W counted whole
    (zero_bubble_v.build_zb_v's table, every rank)."""
    return minimum(2 * pp, 2 * m)


def chimera_in_flight(pp: Num, vpp: Num, m: Num, rank: Num) -> Num:
    """Chimera: Li & Hoefler 2021 Table 1, between p/2 + 1 (the end ranks) and p (the middle ones) micro-batches
    (chimera.build_chimera's table): every rank taken at p."""
    return minimum(pp, m)


def interleaved_embedding(pp: Num, m: Num) -> Num:
    """Of the interleaved warm-up's forwards in flight at the first backward, p + (p − 1) = 2p − 1 are chunk 0's
    (Megatron-LM runs forwards in blocks of p micro-batches per chunk), the only chunk holding the embedding."""
    return minimum(m, 2 * pp - 1)


def zb_v_embedding(pp: Num, m: Num) -> Num:
    """ZB-V: rank 0's 2p chunk-0 forwards before its first chunk-0 input gradient (build_zb_v)."""
    return minimum(m, 2 * pp)


# ---- weight versions (steady.table_weight_versions reads them off the tables) ----------------------------------------
def one_version(pp: Num, last: bool) -> Num:
    """A synchronous schedule updates only after its flush: one version."""
    return 1


def stashed_versions(pp: Num, last: bool) -> Num:
    """PipeDream: p − r, one per micro-batch in flight (Narayanan et al. 2019 §3.3, weight stashing)."""
    return 1 if last else pp


def double_buffered(pp: Num, last: bool) -> Num:
    """PipeDream-2BW: min(2, p − r) (Narayanan et al. 2021 §3.1: double-buffered; the last rank's forward and
    backward of a micro-batch are adjacent, so it needs one)."""
    return minimum(2, 1 if last else pp)


# ---- refusals: the reasons a plan's shape does not run under its schedule ([] if it does) ---------------------------
def refuse_line(s: PlanShape) -> list[str]:
    """GPipe, 1F1B: one model chunk per rank."""
    if s.vpp > 1:
        return [f"vpp={s.vpp} needs schedule='interleaved' (got {s.schedule!r})"]
    return []


def refuse_interleaved(s: PlanShape) -> list[str]:
    """Interleaved: v > 1 chunks on p > 1 ranks, p dividing m (Megatron-Core's default group of p micro-batches)."""
    if s.vpp == 1 or s.pp == 1:
        return [f"schedule='interleaved' needs pp > 1 and vpp > 1 (pp={s.pp}, vpp={s.vpp})"]
    if s.m is not None and s.m % s.pp:
        return [f"interleaved schedule: pp={s.pp} does not divide the {s.m} micro-batches"]
    return []


def refuse_async(s: PlanShape) -> list[str]:
    """An asynchronous schedule (PipeDream, PipeDream-2BW) needs a pipeline of one model chunk per rank, and 2BW at
    least as many micro-batches per weight update as stages (m >= p: Narayanan et al. 2021 §3.1)."""
    allowed = "allowed with it: pp > 1, vpp = 1"
    if s.pp == 1:
        return [f"schedule={s.schedule} needs pp > 1 (got pp=1): an asynchronous schedule pipelines stages; "
                f"with pp=1 use schedule 1f1b"]
    if s.vpp > 1:
        return [f"vpp={s.vpp} with schedule={s.schedule}: asynchronous schedules run one model chunk per rank "
                f"({allowed}; vpp > 1 needs schedule interleaved)"]
    return []


def refuse_2bw(s: PlanShape) -> list[str]:
    """PipeDream-2BW: the asynchronous rules, and m >= p."""
    if reasons := refuse_async(s):
        return reasons
    if s.m is not None and s.m < s.pp:
        return [f"schedule=pipedream-2bw needs micro-batches per step m >= pp (m = global_batch/(dp*micro_batch) = "
                f"{s.m}, pp={s.pp}): 2BW updates the weights every m >= pp micro-batches"]
    return []


def _one_chunk(s: PlanShape) -> list[str]:
    if s.pp == 1 or s.vpp > 1:
        return [f"schedule={s.schedule} needs pp > 1 and vpp = 1 (pp={s.pp}, vpp={s.vpp})"]
    return []


def refuse_zb_h1(s: PlanShape) -> list[str]:
    """ZB-H1 (zero_bubble.py) runs one model chunk per rank on a pipeline."""
    return _one_chunk(s)


def _even_stages(s: PlanShape) -> list[str]:
    if any(s.stage_layers):
        return [f"schedule={s.schedule} runs even stages: first_stage_layers and last_stage_layers must be 0 "
                f"(got {s.stage_layers[0]}, {s.stage_layers[1]})"]
    return []


def refuse_zb_v(s: PlanShape) -> list[str]:
    """ZB-V: two chunks per rank, the V (zero_bubble_v.py), on even stages; its bubble form needs m >= 2p."""
    if reasons := _even_stages(s):
        return reasons
    if s.pp == 1 or s.vpp != 2:
        return [f"schedule=zb-v needs pp > 1 and vpp = 2 (its two chunks per rank; pp={s.pp}, vpp={s.vpp})"]
    if s.m is not None and s.m < 2 * s.pp:
        return [f"schedule=zb-v needs m >= 2*pp micro-batches (pp={s.pp}, m = global_batch/(dp*micro_batch) = "
                f"{s.m})"]
    return []


def refuse_dualpipe(s: PlanShape) -> list[str]:
    """DualPipe's two directions each feed half of the micro-batches into one end of the pipeline, so p and m are
    even, and m >= 2·p as deepseek-ai/DualPipe's DualPipe.step asserts (DeepSeek-V3 §3.2.1, Figure 5: 8 ranks, 20
    micro-batches, 10 each way)."""
    if reasons := _one_chunk(s):
        return reasons
    if s.pp % 2 or (s.m is not None and (s.m % 2 or s.m < 2 * s.pp)):
        return [f"schedule=dualpipe needs an even pp and an even number of micro-batches m >= 2*pp (deepseek-ai/"
                f"DualPipe's own check; pp={s.pp}, m = global_batch/(dp*micro_batch) = {s.m})"]
    return []


def refuse_chimera(s: PlanShape) -> list[str]:
    """Chimera: one basic unit of p micro-batches, half down and half up (Li & Hoefler 2021 §3.1, Figure 3), p
    even, on even stages. More micro-batches than stages the paper runs with forward doubling or backward halving
    (§3.5), which meshplan does not model: direct concatenation, which its table would run, is not how the paper
    runs them (its intermediate bubbles grow with m where T_B > T_F)."""
    if reasons := _even_stages(s) or _one_chunk(s):
        return reasons
    if s.pp % 2 or (s.m is not None and s.m != s.pp):
        return [f"schedule=chimera needs an even pp equal to the number of micro-batches (one basic unit, half each "
                f"way; pp={s.pp}, m = global_batch/(dp*micro_batch) = {s.m}): more micro-batches run Chimera's "
                f"forward doubling / backward halving (Li & Hoefler 2021 §3.5), not modelled"]
    return []


# ---- the search's rows: the shapes each schedule runs, over a batch's arrays (the refusals above, vectorised; ``even``
# a bool or a bool array: the rows without an uneven first or last stage) ----------------------------------------------
def runs_any(pp: Num, vpp: Num, m: Num, even: Any) -> Num:
    return vpp == 1


def runs_interleaved(pp: Num, vpp: Num, m: Num, even: Any) -> Num:
    return vpp > 1


def runs_one_chunk(pp: Num, vpp: Num, m: Num, even: Any) -> Num:
    return (vpp == 1) & (pp > 1)


def runs_2bw(pp: Num, vpp: Num, m: Num, even: Any) -> Num:
    return (vpp == 1) & (pp > 1) & (m >= pp)


def runs_zb_v(pp: Num, vpp: Num, m: Num, even: Any) -> Num:
    return (vpp == 2) & (pp > 1) & (m >= 2 * pp) & even


def runs_dualpipe(pp: Num, vpp: Num, m: Num, even: Any) -> Num:
    return (vpp == 1) & (pp > 1) & (pp % 2 == 0) & (m % 2 == 0) & (m >= 2 * pp)


def runs_chimera(pp: Num, vpp: Num, m: Num, even: Any) -> Num:
    return (vpp == 1) & (pp > 1) & (pp % 2 == 0) & (m == pp) & even
