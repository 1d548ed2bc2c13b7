"""The answers kept for the questions a search asks again (issue 83): the host's per-op sums of a group
(step/host._issued), a group's summed times (step/passes._sums), a plan's group split over the tiers
(collectives/comm.split_group), the tile choices of a few GEMMs (specs/gemm_shape._small_choice), a plan's ranks'
parameters (step/grid.rank_params) and a rank's shared part (step/ranks.rank_shared) are what the computation gives
afresh, bit for bit, and a caller cannot change what the next caller gets."""

from __future__ import annotations

import numpy as np
import pytest

from draws import draw_kept
from meshplan.collectives.comm import Collective, Layout, _split, split_group  # noqa: PLC2701 (its own)
from meshplan.cost.params import middle_params, stage_params
from meshplan.cost.records import OpCost
from meshplan.specs.gemm_shape import TILES, _tile_choice, tile_choice  # noqa: PLC2701 (its own)
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.step.grid import PARAMS_READ, _params, params_of_rank, rank_params  # noqa: PLC2701 (its own)
from meshplan.step.host import host_times, most_launches
from meshplan.step.passes import PassTimes, _summed, _sums, pass_times  # noqa: PLC2701 (its own)

US = 1e-6
ROWS = 7
OPS = [OpCost("norm", "fwd", "memory", 0.0, 1e3),
       OpCost("qkv", "fwd", "gemm", np.linspace(1e6, 2e6, ROWS), 1e3, kernels=np.arange(1.0, ROWS + 1)),
       OpCost("tp_out", "fwd", "collective", nbytes=1e3, collective=Collective("all_reduce", 1e3, "tp", 8)),
       OpCost("qkv", "bwd_x", "gemm", 2e6, 1e3, launches=np.full(ROWS, 3.0), launch_host=5 * US),
       OpCost("norm/eager", "bwd_x", "memory", 0.0, 1e3, kernels=12, host=np.full(ROWS, 2 * US))]


def _times() -> list:
    rng = np.random.default_rng(83)
    return [rng.random(ROWS) * US for _ in OPS]


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_kept_host_sums_are_the_fresh_ones(recompute: str) -> None:
    host = Stack(host_dispatch=10 * US).host
    for count_of in (None, most_launches):
        args = () if count_of is None else (count_of,)
        first = host_times(OPS, Plan(), host, recompute, *args)
        again = host_times(OPS, Plan(), host, recompute, *args)
        fresh = host_times(list(OPS), Plan(), host, recompute, *args)  # another list: computed afresh
        for ph in "fb":
            assert np.array_equal(first[ph], fresh[ph]) and np.array_equal(again[ph], fresh[ph])


def test_kept_sums_are_the_fresh_ones_and_read_only() -> None:
    times = _times()
    kept = _sums(OPS, times, False)
    assert _sums(OPS, times, False) is kept  # the same lists: the kept answer
    fresh = _summed(OPS, times, False)
    assert kept.keys() == fresh.keys()
    for key, value in kept.items():
        assert np.array_equal(value, fresh[key])
        if isinstance(value, np.ndarray):
            with pytest.raises(ValueError, match="read-only"):
                value += 1.0
    stack = Stack(host_dispatch=10 * US)
    for recompute in ("none", "selective", "full"):  # the pass sums as from lists met for the first time
        kept_pass = pass_times(OPS, times, Plan(), stack, recompute)
        fresh_pass = pass_times(list(OPS), list(times), Plan(), stack, recompute)
        assert all(np.array_equal(getattr(kept_pass, f), getattr(fresh_pass, f)) for f in PassTimes.__slots__)


@pytest.mark.parametrize(("group", "layout"), [(8, 1), (8.0, 1.0), (16, 4), (2.0, 1.5), (32, ((4, 1), (8, 16))),
                                               (64, ((8.0, 2), (8, 64.0)))])
def test_kept_splits_are_the_fresh_ones(group: float, layout: Layout) -> None:
    cluster = load_system("h100").cluster(1024)
    first = split_group(cluster, group, layout)
    assert first == _split(cluster, group, layout)
    assert all(type(x) is float for x in first)  # Python floats: the same for 8 as for 8.0
    first.append(-1.0)  # a caller's change stays its own
    assert split_group(cluster, group, layout) == _split(cluster, group, layout)


def test_kept_tile_choices_are_the_fresh_ones() -> None:
    m = np.array([512.0, 4096.0, 100.0, 512.0])
    args = (m, 7168.0, np.array([2048.0, 1024.0, 512.0, 2048.0]), 132, 1.0, TILES, 64.0)
    fresh = _tile_choice(*args)
    for _ in range(2):
        kept = tile_choice(m.copy(), *args[1:])
        assert all(np.array_equal(a, b) for a, b in zip(kept, fresh, strict=True))
        kept[0][:] = -1.0  # a caller's change stays its own


def test_kept_sums_go_with_their_units() -> None:
    from meshplan.specs.model_load import load_model  # noqa: PLC0415
    from meshplan.step import host, passes  # noqa: PLC0415
    from meshplan.step.units import unit_costs  # noqa: PLC0415

    cluster = load_system("h100").cluster(64)
    unit_costs(load_model("llama3-8b"), cluster, Plan(tp=2, pp=2, dp=16), Stack(host_dispatch=10 * US))
    assert not passes._SUMS and not host._ISSUED  # noqa: SLF001 (dropped once the units are built)


# a value other than the plans' below for every field the ranks' parameters do not read (step/grid.PARAMS_READ)
UNREAD = {"dp": 16, "cp": 2, "sequence_parallel": True, "micro_batch": 4, "global_batch": 4096, "zero": 3,
          "recompute": "full", "recompute_layers": 2, "recompute_modules": ("mlp",), "stage_recompute": ("full",) * 4,
          "stage_offload": (1,) * 4, "offload_optimizer": True, "offload_activations": True, "offload_layers": 1,
          "precision": "fp8", "optimizer": "sgd", "grad_bytes": 2, "placement": ("pp", "dp", "cp", "tp2", "tp"),
          "summa_panels": 3, "dp_mode": "ps", "servers": 4, "collectives": "mst", "offload_weights": True,
          "moe_expert_capacity_factor": 1.0, "moe_pad_expert_input_to_capacity": True,
          "distributed_optimizer_instances": 2}


@pytest.mark.parametrize(("name", "plan"), [
    ("llama3-70b", Plan(dp=8, tp=8, pp=4, global_batch=512)),
    ("llama3-70b", Plan(dp=8, tp=4, pp=4, vpp=2, last_stage_layers=16, global_batch=512, finetune="lora")),
    ("deepseek-v3", Plan(dp=32, tp=2, pp=4, ep=16, global_batch=1024, first_stage_layers=13)),
    ("mixtral-8x7b", Plan(dp=8, tp=2, pp=4, ep=4, etp=1, global_batch=256, stage_layers=(6, 8, 9, 9))),
    ("mixtral-8x7b", Plan(dp=4, tp=2, pp=4, ep=2, global_batch=256, schedule="chimera")),
])
def test_kept_rank_params_read_only_their_fields(name: str, plan: Plan) -> None:
    model = load_model(name)
    assert set(UNREAD) | set(PARAMS_READ) | {"tags"} == set(Plan.__dataclass_fields__)  # every field named
    fresh = _params(model, plan)
    ranks = [stage_params(model, plan, r == 0) if r in (0, plan.pp - 1) else middle_params(model, plan, r)
             for r in range(plan.pp)]
    assert rank_params(model, plan) == fresh
    for field, value in UNREAD.items():  # a plan differing elsewhere: the same parameters, computed or kept
        other = plan.with_(**{field: value})
        assert _params(model, other) == fresh, field
        assert rank_params(model, other) == fresh, field
        assert [params_of_rank(model, other, r) for r in range(plan.pp)] == ranks, field
    wider = plan.with_(tp=2 * plan.tp, etp=2 * plan.etp)  # a field they read: its own
    assert rank_params(model, wider) == _params(model, wider) != fresh



def test_kept_rank_params_of_drawn_plans() -> None:
    """The same on 40 drawn (model, plan) pairs (tests/draws.py: every axis and option), each field flipped alone."""
    for model, _, plan, _ in draw_kept(83, 40, lambda *_: True):
        fresh = _params(model, plan)
        for field, value in UNREAD.items():
            other = plan.with_(**{field: value})
            assert _params(model, other) == rank_params(model, other) == fresh, (model.name, plan, field)


def test_kept_rank_shared_is_the_fresh_one() -> None:
    from meshplan.specs.efficiency import DEFAULT as EFF
    from meshplan.step.ranks import _rank_shared, rank_shared  # noqa: PLC2701 (its own)
    model, cluster = load_model("deepseek-v3"), load_system("h100").cluster(256)
    plan, stack = Plan(dp=8, tp=2, pp=4, ep=8, global_batch=256, stage_layers=(13, 16, 16, 16)), Stack()
    for rank in (0, 3, 1):
        kept = rank_shared(model, cluster, plan, stack, EFF, rank)
        assert rank_shared(model, cluster, plan, stack, EFF, rank) is kept  # the same objects: kept
        assert kept == _rank_shared(model, cluster, plan, stack, EFF, rank)
    other = plan.with_(stage_layers=(16, 16, 16, 13))  # an equal plan is not the same object: priced again
    assert rank_shared(model, cluster, other, stack, EFF, 0) == _rank_shared(model, cluster, other, stack, EFF, 0)


def _settings(plan: Plan) -> dict[str, object]:
    """A value other than the plans' for every field of the ranks' settings (step/ranks.SETTINGS_UNREAD)."""
    return {"recompute": "full", "recompute_layers": 2, "offload_activations": True, "offload_layers": 1,
            "stage_recompute": ("selective",) * plan.pp, "stage_offload": (1,) * plan.pp}


def test_rank_shared_reads_no_ranks_setting() -> None:
    """A plan differing from another only in its ranks' recompute and activation offload (each field flipped alone,
    then all): every rank's shared part computed afresh is the other's, and the kept one (by the plan without them)
    is the fresh one; on 40 drawn (model, cluster, plan, stack) and a DeepSeek-V3 plan of uneven stages."""
    from meshplan.specs.efficiency import DEFAULT as EFF
    from meshplan.step.ranks import SETTINGS_UNREAD, _rank_shared, rank_shared  # noqa: PLC2701 (its own)
    drawn = [(m, c, p, s) for m, c, p, s in draw_kept(83, 40, lambda *_: True)]
    deepseek = (load_model("deepseek-v3"), load_system("h100").cluster(256),
                Plan(dp=8, tp=2, pp=4, ep=8, global_batch=256, stage_layers=(13, 16, 16, 16)), Stack())
    for model, cluster, plan, stack in [deepseek, *drawn]:
        flips = _settings(plan)
        assert flips.keys() == SETTINGS_UNREAD.keys()
        for changes in [*({k: v} for k, v in flips.items()), flips]:
            other = plan.with_(**changes)
            for rank in sorted({0, plan.pp // 2, plan.pp - 1}):
                fresh = _rank_shared(model, cluster, plan, stack, EFF, rank)
                assert _rank_shared(model, cluster, other, stack, EFF, rank) == fresh, (model.name, plan, changes)
                assert rank_shared(model, cluster, other, stack, EFF, rank) == fresh, (model.name, plan, changes)


def test_kept_rank_price_is_the_fresh_one() -> None:
    """``price_rank`` of the same objects again is the answer kept (step/ranks._PRICED), equal to the one computed
    afresh; an equal plan that is another object is priced again."""
    from meshplan.specs.efficiency import DEFAULT as EFF
    from meshplan.step.parts import timed_parts
    from meshplan.step.ranks import _PRICED, price_rank, stage_modes  # noqa: PLC2701 (its own)
    from meshplan.step.units import units_for_recomputes
    model, cluster = load_model("deepseek-v3"), load_system("h100").cluster(256)
    plan = Plan(dp=8, tp=2, pp=4, ep=8, global_batch=256, stage_layers=(13, 16, 16, 16), stage_recompute=(
        "full", "selective", "none", "none"))
    stack = Stack()
    units = units_for_recomputes(model, plan, stack, timed_parts(model, cluster, plan, stack, EFF),
                                 stage_modes(plan), EFF)
    for rank in range(plan.pp):
        kept = price_rank(model, cluster, plan, stack, units, EFF, rank)
        assert price_rank(model, cluster, plan, stack, units, EFF, rank) is kept
        _PRICED.answers.clear()
        assert price_rank(model, cluster, plan, stack, units, EFF, rank) == kept  # computed afresh: equal
    twin = plan.with_()  # equal, another object
    assert price_rank(model, cluster, twin, stack, units, EFF, 0) is not price_rank(model, cluster, plan, stack,
                                                                                      units, EFF, 0)


class _Afresh:
    """A memo that keeps nothing: every answer computed afresh (xp.Kept's ``answer``)."""

    @staticmethod
    def answer(key: object, held: object, compute, *args):  # noqa: ANN001, ANN205 (Kept's signature)
        return compute(*args)


def _bits(x: object) -> bytes:
    """Every number of ``x`` bit for bit (pickle writes a float's 8 bytes: -0.0 is not 0.0)."""
    import pickle
    return pickle.dumps(x)


def _apart_plans() -> list[tuple]:
    """Plans whose ranks are priced apart (step/ranks.priced_apart): uneven stages, per-rank recompute (the block
    method's counts too) and offload, interleaved, ZB-V (the head on the first rank), Chimera (the ends half each),
    every rank alike (as the stage DP's lines' trial plans, search/stage_lines._trial) and the optimizer offloaded."""
    deepseek, llama = load_model("deepseek-v3"), load_model("llama3-70b")
    big = small = load_system("h100").cluster(64)
    return [
        (deepseek, big, Plan(dp=8, tp=2, pp=4, ep=8, global_batch=256, stage_layers=(13, 16, 16, 16),
                             stage_recompute=("full", "selective", "none", "none")), Stack()),
        (deepseek, big, Plan(dp=4, tp=2, pp=8, ep=4, global_batch=256, stage_layers=(5, 8, 8, 8, 8, 8, 8, 8),
                             stage_recompute=("2", "selective", "selective", "none", "none", "none", "1", "none"),
                             stage_offload=(2, 1, 1, 0, 0, 0, 0, 0)), Stack()),
        (llama, small, Plan(dp=2, tp=4, pp=8, vpp=2, global_batch=64, stage_layers=(8, 12, 10, 10, 10, 8, 10, 12)),
         Stack()),
        (llama, small, Plan(dp=2, tp=4, pp=8, vpp=2, global_batch=64, schedule="zb-v",
                            stage_recompute=("full",) + ("none",) * 7), Stack()),
        (llama, small, Plan(dp=2, tp=4, pp=8, global_batch=16, schedule="chimera",
                            stage_offload=(1,) + (0,) * 7), Stack()),
        (llama, small, Plan(dp=2, tp=4, pp=8, global_batch=64, stage_layers=(10,) * 8,
                            stage_recompute=("selective",) * 8, stage_offload=(2, 0, 1, 0, 2, 2, 0, 2)), Stack()),
        (llama, small, Plan(dp=2, tp=4, pp=8, global_batch=64, stage_layers=(8, 12, 10, 10, 10, 8, 10, 12), zero=2,
                            offload_optimizer=True), Stack()),
    ]


# step/ranks' memos of a rank's parts: its passes and channels, its price, its passes per micro-batch, its model states
# and its view
MEMOS = ("_PASSES", "_PRICED", "_TIMES", "_STATES", "_VIEWS")


@pytest.mark.parametrize("case", range(7))
def test_kept_rank_passes_are_the_fresh_ones(case: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank's passes and channels kept for the ranks alike (step/ranks._PASSES: the middle ranks of equal layers
    and settings share them) are those computed afresh for each rank, bit for bit: every rank's price and the whole
    estimate, with the memo and without it."""
    from meshplan.estimate import estimate
    from meshplan.specs.efficiency import DEFAULT as EFF
    from meshplan.step import ranks
    from meshplan.step.parts import timed_parts
    from meshplan.step.units import units_for_recomputes
    model, cluster, plan, stack = _apart_plans()[case]
    units = units_for_recomputes(model, plan, stack, timed_parts(model, cluster, plan, stack, EFF),
                                 (*ranks.stage_modes(plan), plan.recompute), EFF)
    memo: dict = {}

    def priced() -> list[bytes]:  # every rank, as assemble_ranks prices them (its middle ranks' shared parts)
        return [_bits(ranks.price_rank(model, cluster, plan, stack, units, EFF, r,
                                       ranks.shared_rank(model, cluster, plan, stack, EFF, r, memo)))
                for r in range(plan.pp)]

    ranks._PASSES.answers.clear()  # noqa: PLC2701 (its own)
    kept = priced()
    assert len(ranks._PASSES.answers) < plan.pp or case == 0  # noqa: PLC2701 (middle ranks shared; none in case 0)
    kept_estimate = estimate(model, cluster, plan, stack, EFF)
    for memo_name in MEMOS:
        monkeypatch.setattr(ranks, memo_name, _Afresh())
    assert priced() == kept
    fresh_estimate = estimate(model, cluster, plan, stack, EFF)
    assert _bits(fresh_estimate.detail.costs) == _bits(kept_estimate.detail.costs)  # type: ignore[union-attr]
    assert _bits(fresh_estimate.to_dict(ops=True)) == _bits(kept_estimate.to_dict(ops=True))


@pytest.mark.parametrize("plan", [
    Plan(tp=8, pp=4, global_batch=2048, micro_batch=1),
    Plan(tp=4, pp=8, vpp=2, global_batch=2048, micro_batch=2, sequence_parallel=True),
    Plan(tp=8, pp=4, global_batch=2048, micro_batch=1, zero=1, offload_optimizer=True, recompute="full",
         recompute_layers=3)], ids=["1f1b", "interleaved", "offload-opt"])
def test_kept_rank_lines_across_counts_are_the_fresh_ones(plan: Plan, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stage DP's lines of one pipeline on each GPU count of a strong-scaling sweep (search/stage_lines.rank_lines,
    the counts differing in dp alone) with step/ranks' memos, which share a rank's passes per micro-batch across the
    counts (``_TIMES``: their units are the same objects) and its model states across its settings (``_STATES``),
    are the lines computed afresh, bit for bit; and the counts did share."""
    from meshplan.search.stage_lines import BASES, rank_lines
    from meshplan.specs.efficiency import DEFAULT as EFF
    from meshplan.step import ranks
    model, system, stack = load_model("llama3-70b"), load_system("h100"), Stack()
    sweep = [(system.cluster(n), plan.with_(dp=n // (plan.tp * plan.pp))) for n in (128, 256, 512)]
    for memo_name in MEMOS:
        getattr(ranks, memo_name).answers.clear()
    kept = [_bits(rank_lines(model, [cluster] * p.pp, p, stack, EFF, BASES)) for cluster, p in sweep]
    assert len(ranks._TIMES.answers) < len(sweep) * 3 * 2 * len(BASES)  # noqa: PLC2701 (shared across the counts)
    for memo_name in MEMOS:
        monkeypatch.setattr(ranks, memo_name, _Afresh())
    assert [_bits(rank_lines(model, [cluster] * p.pp, p, stack, EFF, BASES)) for cluster, p in sweep] == kept


def test_kept_rank_parts_tell_apart_what_they_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """The memos of a rank's parts (``MEMOS``) keep apart what their computations read: middle ranks alike but for
    the layers they recompute in full (N), and a plan alike but for its chunks (vpp), priced with the same units,
    are priced as afresh, bit for bit."""
    from meshplan.specs.efficiency import DEFAULT as EFF
    from meshplan.step import ranks
    from meshplan.step.parts import timed_parts
    from meshplan.step.units import units_for_recomputes
    model, cluster, stack = load_model("llama3-70b"), load_system("h100").cluster(64), Stack()
    plans = [Plan(dp=2, tp=4, pp=4, global_batch=64, stage_layers=(20,) * 4,
                  stage_recompute=("none", "2", "1", "none")),
             Plan(dp=2, tp=4, pp=4, vpp=2, global_batch=64, stage_layers=(20,) * 4, recompute="none")]
    units = units_for_recomputes(model, plans[0], stack, timed_parts(model, cluster, plans[0], stack, EFF),
                                 ("none", "full"), EFF)  # one units object for both plans: their keys could meet

    def priced() -> list[bytes]:
        return [_bits(ranks.price_rank(model, cluster, p, stack, units, EFF, r)) for p in plans for r in range(p.pp)]

    for memo_name in MEMOS:
        getattr(ranks, memo_name).answers.clear()
    kept = priced()
    for memo_name in MEMOS:
        monkeypatch.setattr(ranks, memo_name, _Afresh())
    assert priced() == kept
