"""One record per pipeline schedule: every caller (the plan's check, the estimate, the search, the ranks priced apart,
memory, tables.build's tables, the report's timelines, the config emitters) asks it here, and no module but this one
and names.py writes a schedule's name, in ``meshplan.pipeline`` or outside it (tests/test_pipeline_registry.py):
adding a schedule is adding its record.

A record holds how its action table is drawn (``warmup``: tables.build's table, each rank's forwards before its
first backward; ``timeline``: the name of its own table's builder in timelines.py, which the tables' modules, above
this one, are loaded only to draw), its bubble over per-rank times and its paper's (forms.py), its in-flight rule
(activation memory), weight versions and weight copies, where its first and last stages sit, its refusals and the
search's rows (rules.py), and the frameworks that run it (with their names for it).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from meshplan.pipeline import forms, rules
from meshplan.pipeline.forms import RankTimes
from meshplan.pipeline.names import ALL, ASYNC, SPLIT, SYNC
from meshplan.xp import Num

Bubble = Callable[[RankTimes, Num, Num], Num]  # (ranks, v, m) -> seconds per step
InFlight = Callable[[Num, Num, Num, Num], Num]  # (p, v, m, rank) -> model chunks held
Refuse = Callable[[rules.PlanShape], list[str]]
Runs = Callable[[Num, Num, Num, Num], Num]  # (p, v, m, even stages) -> the rows a search batch may run
Warmup = Callable[[int, int, int, int, int], int]  # (p, m, v, N, rank) -> forwards before the first backward

# torch.distributed.pipelining's class names as torchtitan 0.2.2 takes them (``pipeline_parallel_schedule``)
TORCHTITAN_CLASSES = "torchtitan"
# Megatron-Core 0.16.1's pipeline_parallel/schedules.py (forward_backward_pipelining_without / with_interleaving),
# which Megatron-LM, NeMo, Megatron-Bridge and verl's Megatron backend run
MEGATRON_CORE = "megatron"


@dataclass(frozen=True, kw_only=True, slots=True)
class Schedule:
    """A pipeline schedule (module docstring). ``chunks``: model chunks per rank it runs (0: any v >= 2)."""

    name: str
    title: str
    family: str  # names.SYNC, ASYNC or SPLIT: synchronous, asynchronous (no flush), split backward / bidirectional
    bubble: Bubble
    in_flight: InFlight
    refuse: Refuse
    runs: Runs
    chunks: int = 1
    embedding_in_flight: Callable[[Num, Num], Num] | None = None  # (p, m); None: ``in_flight`` of rank 0
    warmup: Warmup | None = None  # tables.build's table: its warm-up (None: a table of its own, ``timeline``)
    published: forms.Published | None = None  # its paper's bubble, equal ranks, T_W apart (split schedules)
    timeline: str = ""  # the builder of its table for the report (timelines.BUILDERS); "": tables.build's
    weight_versions: Callable[[Num, bool], Num] = rules.one_version
    # copies of a rank's parameters, gradients and optimizer state (DualPipe 2: DeepSeek-V3 Table 2's "2×" parameters)
    weight_copies: int = 1
    update_every_micro: bool = False  # PipeDream: a weight update (DP reduction, optimizer step) per micro-batch
    head_first: bool = False  # the LM head and loss on the first rank (ZB-V's V; Chimera's both ends)
    head_last: bool = True
    embed_last: bool = False  # the embedding on the last rank too (Chimera's up pipeline)
    mirrored: bool = False  # rank r also runs stage p − 1 − r for half the micro-batches (Chimera)
    ep_overlapped: bool = False  # a forward and a backward chunk's EP all-to-alls hidden under each other (DualPipe)
    priced_apart: bool = True  # step/ranks.py can price its ranks apart (not: two stages a rank, weight versions)
    # its stages split the layers evenly (ZB-V's V, Chimera's mirrored pipelines): no per-rank layer counts
    even_stages: bool = False
    frameworks: Mapping[str, str] = field(default_factory=dict)  # framework -> its name for the schedule
    note: str = ""  # what the ranked table says of a plan under it

    @property
    def flushes(self) -> bool:
        return self.family != "async"

    @property
    def split(self) -> bool:
        return self.family == "split"

    @property
    def opt_in(self) -> bool:
        """Searched only where asked for (search.Space's async_pipeline, split_backward): the asynchronous and the
        split-backward schedules, whose bubble is none or less than 1F1B's."""
        return self.family != "sync"

    @property
    def ends_apart(self) -> bool:
        """Its first and last stage on different ranks (not ZB-V's V, nor DualPipe's and Chimera's mirrored
        pipelines, whose end ranks hold both ends)."""
        return self.head_last and not self.mirrored and self.weight_copies == 1

    def end_shares(self, pp: int, rank: int) -> tuple[float, float]:
        """The shares of one micro-batch's embedding and LM head (with the loss) that rank ``rank`` runs: the
        embedding on the first rank and the head on the last (ZB-V's V: on the first); Chimera's end ranks each
        run half of the micro-batches through the first stage and half through the last, half of each."""
        if self.mirrored:
            end = 0.5 * (rank in (0, pp - 1))
            return end, end
        return float(rank == 0), float(rank == (pp - 1 if self.head_last else 0))

    def refusals(self, pp: int, vpp: int, m: int | None, stage_layers: tuple[int, int] = (0, 0)) -> list[str]:
        return self.refuse(rules.PlanShape(schedule=self.name, pp=pp, vpp=vpp, m=m, stage_layers=stage_layers))


_RECORDS = (
    Schedule(name="gpipe", title="GPipe", family="sync", bubble=forms.line, in_flight=rules.all_in_flight,
             refuse=rules.refuse_line, runs=rules.runs_one_chunk, warmup=rules.all_warmup,
             frameworks={TORCHTITAN_CLASSES: "GPipe"}),
    Schedule(name="1f1b", title="1F1B", family="sync", bubble=forms.line, in_flight=rules.line_in_flight,
             refuse=rules.refuse_line, runs=rules.runs_any, warmup=rules.line_warmup,
             frameworks={TORCHTITAN_CLASSES: "1F1B", MEGATRON_CORE: "1f1b"}),
    Schedule(name="interleaved", title="interleaved 1F1B", family="sync", bubble=forms.line, chunks=0,
             in_flight=rules.interleaved_in_flight, embedding_in_flight=rules.interleaved_embedding,
             refuse=rules.refuse_interleaved, runs=rules.runs_interleaved, warmup=rules.interleaved_warmup,
             frameworks={TORCHTITAN_CLASSES: "Interleaved1F1B", MEGATRON_CORE: "interleaved"}),
    Schedule(name="pipedream", title="PipeDream, first step", family="async", bubble=forms.none,
             in_flight=rules.async_in_flight, weight_versions=rules.stashed_versions, update_every_micro=True,
             refuse=rules.refuse_async, runs=rules.runs_one_chunk, priced_apart=False, warmup=rules.line_warmup,
             note="stale weights, not synchronous SGD: a weight update after every micro-batch (optimizer batch "
                  "dp x micro_batch), each in-flight micro-batch's weights stashed, p - r versions on rank r "
                  "(Narayanan et al. 2019); no framework preset runs it"),
    Schedule(name="pipedream-2bw", title="PipeDream-2BW, first step", family="async", bubble=forms.none,
             in_flight=rules.async_in_flight, weight_versions=rules.double_buffered, refuse=rules.refuse_2bw,
             runs=rules.runs_2bw, priced_apart=False, warmup=rules.line_warmup,
             note="stale weights, not synchronous SGD: one update per m micro-batches from gradients of the previous "
                  "weight version, 2 versions per rank (Narayanan et al. 2021, 2BW); no framework preset runs it"),
    Schedule(name="zb-h1", title="ZB-H1", family="split", bubble=forms.zb_h1, in_flight=rules.zb_h1_in_flight,
             refuse=rules.refuse_zb_h1, runs=rules.runs_one_chunk, published=forms.published_zb_h1,
             timeline="zb_h1_table"),
    Schedule(name="zb-v", title="ZB-V", family="split", bubble=forms.zb_v, chunks=2, in_flight=rules.zb_v_in_flight,
             embedding_in_flight=rules.zb_v_embedding, head_first=True, head_last=False, refuse=rules.refuse_zb_v,
             runs=rules.runs_zb_v, even_stages=True, published=forms.published_zb_v,
             timeline="zb_v_table"),
    Schedule(name="dualpipe", title="DualPipe", family="split", bubble=forms.dualpipe,
             in_flight=rules.dualpipe_in_flight, weight_copies=2, ep_overlapped=True, priced_apart=False,
             refuse=rules.refuse_dualpipe, runs=rules.runs_dualpipe, published=forms.published_dualpipe,
             timeline="dualpipe_table"),
    Schedule(name="chimera", title="Chimera", family="split", bubble=forms.chimera, in_flight=rules.chimera_in_flight,
             head_first=True, embed_last=True, mirrored=True, refuse=rules.refuse_chimera, runs=rules.runs_chimera,
             even_stages=True, published=forms.published_chimera, timeline="chimera_table"),
)
REGISTRY: dict[str, Schedule] = {s.name: s for s in _RECORDS}
assert tuple(REGISTRY) == ALL and {s.family for s in _RECORDS} == {"sync", "async", "split"}
assert tuple(s.name for s in _RECORDS if s.family == "async") == ASYNC
assert tuple(s.name for s in _RECORDS if s.family == "split") == SPLIT
assert tuple(s.name for s in _RECORDS if s.family == "sync") == SYNC
# the order the search tries them (search/evaluate.py's groups) and numbers them (search/explore.py's columns)
SEARCH_ORDER = ("1f1b", "interleaved", "gpipe", *ASYNC, *SPLIT)


def schedule_of(name: object) -> Schedule:
    """The record of ``name`` (a KeyError names the schedules for an unknown one: Plan's check says it first)."""
    try:
        return REGISTRY[str(name)]
    except KeyError:
        raise KeyError(f"schedule={name!r} is none of {', '.join(ALL)}") from None


def default_schedule(vpp: int) -> str:
    """The schedule a plan runs where it names none: interleaved 1F1B with v > 1 chunks a rank, else 1F1B
    (Megatron-LM's choice by ``virtual_pipeline_model_parallel_size``)."""
    return "interleaved" if vpp > 1 else "1f1b"


def one_chunk() -> str:
    """The schedule of one chunk a rank without a flush's extras: 1F1B (autoshard's stage split, RL trainers)."""
    return "1f1b"


def gpipe() -> Schedule:
    """GPipe's record: the search names the plans it drops as 1F1B's dominated twins (search/evaluate.py)."""
    return REGISTRY["gpipe"]


def zero_bubble_h1() -> Schedule:
    """ZB-H1's record: the one-chunk split table the report draws for DualPipe where DualPipe's own does not run
    (timelines.dualpipe_table)."""
    return REGISTRY["zb-h1"]


def interleaving() -> Schedule:
    """The record of v > 1 chunks a rank."""
    return REGISTRY["interleaved"]


def searched(gpipe: bool, asynchronous: tuple[str, ...], split: tuple[str, ...]) -> tuple[str, ...]:
    """The schedules a search tries, in the order it scores them: 1F1B, GPipe where asked, interleaved, then the
    asynchronous and the split-backward ones asked for."""
    return ("1f1b", *(("gpipe",) if gpipe else ()), "interleaved", *asynchronous, *split)


def by_family(family: str, among: Collection[str] | None = None) -> tuple[str, ...]:
    """The schedules of ``family`` ("sync", "async", "split"), in the registry's order; with ``among`` (a framework's
    Supports.schedules), those of them it holds (the search's asynchronous and split-backward ones: search/space.py)."""
    return tuple(s.name for s in _RECORDS if s.family == family and (among is None or s.name in among))


def in_framework(framework: str) -> tuple[str, ...]:
    """The schedules ``framework`` (TORCHTITAN_CLASSES, MEGATRON_CORE) runs (each record's ``frameworks`` holds the
    framework's own name for it)."""
    return tuple(s.name for s in _RECORDS if framework in s.frameworks)
