"""The memory pass of a schedule group: the peak HBM and host bytes of every setting of its size combinations (one
plan each: memory does not depend on the placement) and which the stack's framework refuses, computed once for the
group and read by each block of the branch and bound (search/evaluate.py), whatever order the blocks take.

It reads the size combinations, the space's settings grid and the saved activations of the units (``Saved``), not
the kernel times: a stack switch that changes only the time of some kernels, as the MoE expert GEMMs' (per expert or
grouped, search/variants.py), leaves it unchanged unless it changes what a kernel saves (the per-expert path's
clamped GLU keeps more, cost/mlp_moe.grouped_mlp_eager). Searches with the same jobs are evaluated job by job in one
task (search/workers.py), and a group's pass is reused by the next search when their spaces differ at most in the
expert GEMMs and the saved activations it read are equal (``GroupMemory.reusable``), else computed again.

Each element is computed by the same element-wise arithmetic whichever chunk holds it (step/memory_grid.py: a
batch's middle rank, when it has one, equals the first rank of a plan without one), so the pass in chunks of the
natural order gives the bytes a block in the bound's order would, bit for bit.

The search leaves out, before it computes their kernel units and lower bound (``left_out``, issue 83), the size
combinations the stack refuses under every setting of every schedule group and variant that scores them, decided by
the rules the pass applies (``refusal_codes``). Megatron-Core refuses an MoE layer with tp > 1 without sequence
parallelism (refusals.moe_tp_without_sp): DeepSeek-V3 on 2,048 H100s, 88,632 of the 91,546 size combinations of its
mode without sequence parallelism, 15,068 of its 15,823 op shapes, whose units were computed only for a bound that
the branch and bound then counted as "step time skipped". They are tallied as the pass's refusals are
(``tally_refusals``: each setting under the first rule that refuses it, the first plan it refuses as example) and
counted as evaluated, as before; never timed, nor counted as skipped. The expert-GEMM twin searches of a job take the
first's answer, as they take its passes (their spaces differ only in the expert GEMMs, which no refusal reads).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np

from meshplan.search.batch import PlanBatch
from meshplan.search.candidates import LeftOut, Sized, Twin
from meshplan.search.refused import grid_codes
from meshplan.search.scoring import grid_memory
from meshplan.search.space import Space
from meshplan.search.tally import Rows, Tally, decode, first_set
from meshplan.specs.model import ModelSpec
from meshplan.specs.refusals import Refusal, stack_refusals
from meshplan.step.grid import some_settings
from meshplan.step.units import Saved

# What each setting of a size combination comes to (GroupMemory.status): it fits; its peak is within the HBM's
# headroom or over the HBM; it fits the HBM but not the host's memory; its peak is unknown (NaN: none of these); the
# framework refuses it (REFUSED_FIRST + i: ``rules[i]``, the first rule that does)
FITS, IN_HEADROOM, OVER_HBM, OVER_HOST, UNKNOWN, REFUSED_FIRST = range(6)


@dataclass(frozen=True)
class GroupMemory:
    """Size combinations × settings of one schedule group (the combinations on the first axis, then the grid's
    shape): peak HBM bytes (float32, scoring.grid_memory; NaN where the framework refuses the plan) and host bytes
    (those of a refused plan, never read, NaN or not: ``_fill``), stored for the combinations some setting of which
    the framework runs, each combination's at its row ``index`` (one refused under every setting: the last row, all
    NaN; ``group_memory``), each setting's ``status`` against ``limits`` (the HBM, the HBM less the headroom, the
    host's memory) and, per combination, how many settings have each status (``counts``): the comparisons each block
    of the branch and bound made for itself, made once for the group and every twin search that reuses it.
    ``saved``: the group's saved activations the pass read. The combinations come first so that a block in the
    bound's order reads whole rows (``at``): a gather along the last axis of a (settings × combinations) array read
    element by element, six times slower."""

    peak: np.ndarray
    host: np.ndarray
    index: np.ndarray  # each combination's row of peak and host
    status: np.ndarray
    counts: np.ndarray  # combinations × statuses (REFUSED_FIRST + len(rules) of them), the least unsigned integer type
    rules: tuple[Refusal, ...]
    saved: dict[str, Saved]
    space: Space
    limits: tuple[float, float, float]

    def at(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The status and the peak of the combinations ``rows`` (settings × combinations)."""
        return _settings_first(self.status, rows), _settings_first(self.peak, self.index[rows])

    def plans_of(self, rows: np.ndarray, plans: np.ndarray) -> list[int]:
        """The plans of each status among the combinations ``rows``, each standing for ``plans`` plans: one product
        in float64 (BLAS; whole numbers below 2**53, exact), the rows taken whole."""
        return [int(c) for c in np.dot(plans.astype(np.float64), np.take(self.counts, rows, axis=0).astype(np.float64))]

    def host_at(self, rows: np.ndarray) -> np.ndarray:
        """The host bytes of the combinations ``rows`` (settings × combinations)."""
        return _settings_first(self.host, self.index[rows])

    def reusable(self, space: Space, saved: dict[str, Saved], limits: tuple[float, float, float]) -> bool:
        """Whether the same group searched in ``space`` against ``limits``, whose units save ``saved``, has this
        memory: the space is this one but for the expert GEMMs (module docstring), the saved activations are equal."""
        if limits != self.limits or replace(space, stack=space.stack.with_(expert_gemm=self.space.stack.expert_gemm)
                                            ) != self.space:
            return False
        return saved.keys() == self.saved.keys() and all(
            np.array_equal(getattr(a, f), getattr(self.saved[rc], f))
            for rc, a in saved.items() for f in ("layer_saved", "embed_saved", "head_saved", "layer_working"))


def group_memory(model: ModelSpec, space: Space, pool: PlanBatch, saved: Callable[[np.ndarray], dict[str, Saved]],
                 chunk: int, limits: tuple[float, float, float], codes: np.ndarray | None = None) -> GroupMemory:
    """The memory pass of the size combinations ``pool`` (one plan each), in chunks of ``chunk`` combinations
    (bounded temporaries); ``saved(rows)``: the saved activations of those rows; ``limits``: GroupMemory's.

    The framework's refusals first, for every chunk: a combination refused under every setting (DeepSeek-V3's tp > 1
    combinations without sequence parallelism, 86,041 of 91,546) has NaN bytes and each setting its refusal's status
    whatever its bytes, so only the others' bytes are computed and stored (``GroupMemory.index``), each by the same
    element-wise arithmetic on the same rows as when a chunk's refused combinations were left out by ``_fill``: the
    bytes of the 86,041 are neither written (2 x 8.4 MiB of fresh float32 pages) nor compared with the limits
    (DeepSeek-V3 on 2,048 H100s, its four passes: 166-218 -> 149-172 ms, ``_status`` 23-26 -> 6-8 ms). The search
    leaves such combinations out before it computes their units (``left_out``) unless it explores; ``codes``: the
    pool's ``refusal_codes`` where ``left_out`` found them."""
    shape = (len(pool), *(len(g) for g in space.grid))
    status = np.empty(shape, dtype=np.uint8)
    rules = stack_refusals(space.stack)
    counts = np.empty((len(pool), REFUSED_FIRST + len(rules)), dtype=np.min_scalar_type(math.prod(shape[1:])))
    codes = refusal_codes(model, space, pool, chunk) if codes is None else codes
    chunks = []  # (rows, their combinations, each setting's refusal code (settings first), the rows some setting runs)
    for rows in _chunks(len(pool), chunk):
        sized, block_code = pool.select(rows), codes[..., rows]  # slices: views, nothing gathered
        chunks.append((rows, sized, block_code, np.flatnonzero((block_code == 0).reshape(-1, len(sized)).any(axis=0))))
    stored = sum(len(live) for *_, live in chunks)
    peak, host = np.empty((stored + 1, *shape[1:]), dtype=np.float32), np.empty((stored + 1, *shape[1:]), np.float32)
    peak[stored], host[stored] = np.float32(np.nan), np.float32(np.nan)  # a combination refused under every setting
    index, at = np.full(len(pool), stored, dtype=np.intp), 0
    for rows, sized, block_code, live in chunks:
        refused, whole = np.moveaxis(block_code, -1, 0), len(live) == len(sized)
        # a combination refused under every setting: each setting's refusal (what ``_status`` gives it)
        out = None if whole else refused + np.uint8(REFUSED_FIRST - 1)
        if len(live):
            some, mine = slice(at, at + len(live)), rows.start + live
            _fill(peak[some], host[some], (model, space, sized if whole else sized.select(live),
                                           lambda r, mine=mine: saved(mine[r]), 0),
                  block_code if whole else block_code[..., live])
            part = refused if whole else refused[live]
            if out is None:
                out = _status(peak[some], host[some], part, limits)
            else:
                out[live] = _status(peak[some], host[some], part, limits)
            np.copyto(peak[some], np.float32(np.nan), where=part > 0)  # a refused plan has no memory to show
            index[mine], at = np.arange(at, at + len(live)), at + len(live)
        assert out is not None  # a whole chunk: some setting of every combination runs (``live``)
        status[rows] = out
        counts[rows] = _counted(status[rows], counts.shape[1])
    return GroupMemory(peak, host, index, status, counts, rules, saved(np.arange(len(pool))), space, limits)


def refusal_codes(model: ModelSpec, space: Space, pool: PlanBatch, chunk: int) -> np.ndarray:
    """Each setting's refusal code of every size combination of ``pool`` (one plan each), settings first (the grid's
    shape, then the combinations; uint8): 0 where the stack runs it, else i + 1 for the first of its rules
    (refusals.stack_refusals) that refuses it, i its index: search/refused.grid_codes in chunks of ``chunk``."""
    codes = np.zeros((*(len(g) for g in space.grid), len(pool)), dtype=np.uint8)
    for rows in _chunks(len(pool), chunk):
        grid_codes(model, pool.select(rows), space, codes[..., rows])  # a view: written in place
    return codes


def everywhere(codes: np.ndarray) -> np.ndarray:
    """Per size combination (``codes``: ``refusal_codes``), whether the stack refuses it under every setting."""
    return (codes != 0).reshape(math.prod(codes.shape[:-1]), codes.shape[-1]).all(axis=0)


def refused_plans(codes: np.ndarray, plans: np.ndarray, rules: int) -> list[int]:
    """The plans of each status (``GroupMemory.plans_of``'s list, ``rules`` refusals) of size combinations refused
    under every setting (``codes``: theirs, ``refusal_codes``), each standing for ``plans`` plans: for each distinct
    number of plans, that number times the bincount of each setting's codes of the combinations that have it
    (integers, exact; a setting at a time, so that the bincount's int64 copy of the codes stays small). DeepSeek-V3
    (24 settings x 88,632 combinations, one plan each), in a fresh process: 11-13 -> 7-8 ms against a bincount per
    setting weighted by the plans (float64), 2026-11-30."""
    counts = np.zeros(REFUSED_FIRST + rules, dtype=np.int64)
    flat = codes.reshape(-1, codes.shape[-1])
    values, of = np.unique(plans, return_inverse=True)
    for i, value in enumerate(values):
        for setting in flat if len(values) == 1 else flat[:, of == i]:
            counts[REFUSED_FIRST - 1:] += int(value) * np.bincount(setting, minlength=rules + 1)
    return [int(c) for c in counts]


def _fill(peak: np.ndarray, host: np.ndarray, chunk: tuple[ModelSpec, Space, PlanBatch, Callable, int],
          refused: np.ndarray) -> None:
    """Write the peak and host bytes of a chunk's combinations (``chunk``: the model, the space, the chunk, the saved
    activations of rows and its first row) into ``peak`` and ``host`` (combinations first), NaN where the framework
    refuses every plan (``refused``: settings first, each one's rule or 0; no status reads their bytes: ``_status``
    gives each its refusal): a combination refused under every setting (DeepSeek-V3's tp > 1 combinations without
    sequence parallelism, 86,041 of 91,546), a recompute mode or activation-offload setting refused for every
    combination of the chunk under every ZeRO stage and optimizer offload (megatron-core's activation offload under
    pp > 1 or recompute: every chunk of DeepSeek-V3's and of the 8-count's). The others are computed on those alone,
    each element by the same element-wise arithmetic whichever rows and settings are computed beside it (the module
    docstring)."""
    model, space, sized, saved, start = chunk
    open_ = (refused == 0).reshape(-1, len(sized))  # settings × combinations: not refused
    live = open_.any(axis=0)
    rows = slice(None) if live.all() else np.flatnonzero(live)
    open_ra = open_.any(axis=1).reshape(refused.shape[:-1]).any(axis=(1, 2))  # (recompute, activation offload)
    rcs, oas = np.flatnonzero(open_ra.any(axis=1)), np.flatnonzero(open_ra.any(axis=0))
    whole = len(rcs) == len(space.recompute) and len(oas) == len(space.offload_activations)
    if not (isinstance(rows, slice) and whole):
        peak.fill(np.nan)
        host.fill(np.nan)
        if not len(rcs):
            return
    grid = space if whole else some_settings(space, rcs, oas)
    block = grid_memory(model, sized if isinstance(rows, slice) else sized.select(rows),
                        saved(start + np.arange(len(sized))[rows]), space, grid)
    for out, computed in zip((peak, host), block, strict=True):
        part = np.moveaxis(computed, -1, 0)
        # the settings computed into their places, the others NaN: at most 3 x 2 copies by basic slices; one
        # fancy-indexed assignment (full[:, rcs[:, None], :, :, oas] = the part with those axes first) writes the
        # same and takes 1.5 times as long (816 against 551 us at 5,000 combinations, 2 of 3 modes, 1 of 2 offloads)
        if not whole:
            full = out if isinstance(rows, slice) else np.full((len(part), *out.shape[1:]), np.nan, dtype=out.dtype)
            for i, r in enumerate(rcs):
                for j, a in enumerate(oas):
                    full[:, r, :, :, a] = part[:, i, :, :, j]
            part = full
        if part is not out:
            out[rows] = part


def _status(peak: np.ndarray, host: np.ndarray, refused: np.ndarray, limits: tuple[float, float, float]
            ) -> np.ndarray:
    """Each setting's status: refused by the rule ``refused`` - 1 (0: none), else its peak over the HBM less its
    headroom (IN_HEADROOM) and over the HBM (OVER_HBM); under (its host bytes over the host's: OVER_HOST); or
    neither (a NaN: UNKNOWN). Sums of comparisons (uint8), ten times faster than np.select."""
    capacity, usable, host_capacity = limits
    over, under = peak > usable, peak <= usable
    out = over.view(np.uint8) + (peak > capacity).view(np.uint8)
    out += np.uint8(OVER_HOST) * (under & ~(host <= host_capacity)).view(np.uint8)
    out += np.uint8(UNKNOWN) * (~(under | over)).view(np.uint8)
    np.copyto(out, refused + np.uint8(REFUSED_FIRST - 1), where=refused > 0)
    return out


def _counted(status: np.ndarray, statuses: int) -> np.ndarray:
    """Per combination (``status``: combinations × settings), how many of its settings have each status: one
    bincount of (combination, status) pairs."""
    n = len(status)
    pair = np.multiply(np.arange(n)[:, None], statuses, dtype=np.intp) + status.reshape(n, -1)
    return np.bincount(pair.reshape(-1), minlength=n * statuses).reshape(n, statuses)


def _settings_first(a: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The combinations ``rows`` of ``a`` (combinations × settings), settings × combinations: whole rows gathered,
    the axes moved (a view: no transposing copy; the readers index it, or flatten it in its own memory order)."""
    return np.moveaxis(np.take(a, rows, axis=0), 0, -1)


def _chunks(n: int, size: int) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(n, start + size))


def left_out(model: ModelSpec, space: Space, pool: PlanBatch, sized: Sized,
             groups: list[tuple[np.ndarray | slice, PlanBatch]], twin: Twin, chunk: int) -> LeftOut:
    """The rows of ``pool`` and ``sized`` (its size rows) to search, None where none is: those some schedule group
    and variant (``groups``: each one's rows of the pool and its batch) scores under a setting the stack runs, with
    each group's ``refusal_codes`` of them (``group_memory``'s, one per group of ``groups``); the refusals of the
    others as a tally, and the plans they count as evaluated. ``twin``: the job's holder (evaluate.Start.twin), which
    holds candidates.mode_pool's ``Made`` for ``pool``: the answer is kept in it for a twin search, which takes it;
    ``chunk``: the combinations whose refusals are found at once."""
    made = twin.made
    if made is not None and made.left_out is not None and made.pool is not None and made.pool[0] is pool \
            and made.model == model and made.space is not None and _twins(space, made.space):
        return made.left_out
    codes = [refusal_codes(model, space, batch, chunk) for _, batch in groups]
    runs = np.zeros(len(pool), dtype=bool)
    for (rows, _), code in zip(groups, codes, strict=True):
        runs[rows] |= ~everywhere(code)
    tally, evaluated, rules = Tally(), 0, stack_refusals(space.stack)
    for (rows, batch), code in zip(groups, codes, strict=True):
        out = np.flatnonzero(~runs[rows])
        if len(out):
            part, plans = np.take(code, out, axis=-1), sized.count[rows][out]  # C order: settings first
            tally_refusals(model, space, (Rows(batch, out), part + np.uint8(REFUSED_FIRST - 1)), rules,
                           refused_plans(part, plans, len(rules)), tally)
            evaluated += int(plans.sum()) * space.grid_size
    kept, whole = np.flatnonzero(runs), bool(runs.all())
    group_codes = [code if whole else code[..., runs[rows]] for (rows, _), code in zip(groups, codes, strict=True)]
    searched = ((pool, sized, group_codes) if whole else (pool.select(kept), sized.select(kept), group_codes)
                if len(kept) else None)
    answer = searched, tally, evaluated
    if made is not None and made.pool is not None and made.pool[0] is pool:
        twin.made = replace(made, model=model, space=space, left_out=answer)
    return answer


def _twins(space: Space, other: Space) -> bool:
    """Whether two spaces differ at most in the expert GEMMs (GroupMemory.reusable's test)."""
    return replace(space, stack=space.stack.with_(expert_gemm=other.stack.expert_gemm)) == other


def tally_refusals(model: ModelSpec, space: Space, where: tuple[Rows, np.ndarray], rules: tuple[Refusal, ...],
                   counts: list[int], tally: Tally) -> None:
    """Tally the refused plans of some size combinations (``where``: them and their status, settings ×
    combinations, memory_pass's; ``counts``: the plans of each status) under each rule's reason, with the first
    plan it refuses (the tally keeps the first example)."""
    sized, status = where
    wanted = [REFUSED_FIRST + i for i, rule in enumerate(rules)
              if counts[REFUSED_FIRST + i] and rule.reason(space.stack.name) not in tally.examples]
    firsts = _firsts(status, wanted) if status.flags.c_contiguous and len(wanted) > 1 else {}
    for i, rule in enumerate(rules):
        reason = rule.reason(space.stack.name)
        if counts[REFUSED_FIRST + i] and reason not in tally.examples:
            at = firsts[REFUSED_FIRST + i] if firsts else first_set(status == REFUSED_FIRST + i)
            plan = decode(sized, space.grid, status.shape, at, layers=model.num_layers)
            tally.add(reason, f"{plan.describe()} ({rule.source})", counts[REFUSED_FIRST + i])
        else:
            tally.add(reason, "", counts[REFUSED_FIRST + i])


def _firsts(status: np.ndarray, codes: list[int]) -> dict[int, int]:
    """``first_set(status == code)`` of each of ``codes`` (each held somewhere in ``status``, C-contiguous,
    settings × combinations: left_out's), read a setting at a time until each has been met: the codes a setting
    holds counted by one bincount, each met code's first combination there found by one comparison of the setting's
    row (DeepSeek-V3 on 2,048 H100s, left_out's six rules over 24 settings x 88,632 combinations, each found before
    by a comparison of the whole grid and a strided any(): tally_refusals 21-24 -> 5.4-5.8 ms in process,
    2026-11-30)."""
    rows = status.reshape(-1, status.shape[-1])
    found: dict[int, int] = {}
    for setting, row in enumerate(rows):
        held = np.bincount(row, minlength=max(codes) + 1)
        for code in codes:
            if code not in found and held[code]:
                found[code] = setting * rows.shape[1] + int(np.argmax(row == code))
        if len(found) == len(codes):
            break
    return found
