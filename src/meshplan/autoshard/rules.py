"""Sharding rules: an op's iteration space as labelled dimensions, and what sharding a label on a mesh dimension does.

Alpa (Zheng et al. 2022, OSDI, §4.1 and Table 3) enumerates an operator's parallel algorithms by mapping the
loops of its iteration space to mesh dimensions; DTensor (torch.distributed.tensor._ops) writes the same as
einsum-like strategies (``_einsum_strategy``: "mk,kn->mn"). A ``Rule`` does it for every op the same way:

- each tensor argument and result has one label per dimension (``None``: this dimension is never split, e.g. a
  normalised or a sliced dimension); a matrix product is ``mk,kn->mn``;
- a *strategy* assigns to each mesh dimension one label or nothing (``assignment``); a tensor is then
  ``Shard(d)`` on that mesh dimension where its dimension d carries the label, ``Replicate`` where it does not
  carry it, and a result is ``Partial`` where the label is one it sums over (``sums``; by default every label it
  lacks, einsum's contraction: mm with k split leaves partial sums);
- ``no_partial`` labels cannot be split unless every result carries them (max, softmax: not a sum);
- ``additive`` arguments are added into the result (addmm's bias): Partial where the result is (Replicate ->
  Partial is free);
- ``extra`` collectives run when a label is split (the vocabulary-parallel log-softmax's row statistics, as
  DTensor's ``loss_parallel``).

``PASS`` in an assignment marks a mesh dimension on which a linear op (a view, a copy, neg, a sum) carries a
Partial argument through to a Partial result. A product is linear in each factor but not in both at once (P·P is not
a sum): ``passing(j)`` carries argument j's Partial, the other factors replicated (DTensor's pointwise strategies:
``Partial * Replicate -> Partial``), so the router's gradient Σ_h dy·y takes the experts' Partial output rows as
they are and reduces the small product, as Megatron-LM does, instead of reducing the rows first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from itertools import product
from typing import TypeGuard

from meshplan.autoshard.placement import PARTIAL, REPLICATE, Placements, valid
from meshplan.kept import Kept

Labels = tuple[str | None, ...]
PASS = "<partial>"


def passing(j: int) -> str:
    """The ``PASS`` of a product that carries its argument ``j``'s Partial (module docstring)."""
    return f"{PASS}{j}"


def is_pass(lab: str | None) -> TypeGuard[str]:
    return lab is not None and lab.startswith(PASS)


def _passed(lab: str) -> int:
    """The argument a ``passing(j)`` label carries; -1 for plain ``PASS``."""
    return int(lab[len(PASS):]) if lab != PASS else -1


@dataclass(frozen=True, slots=True)
class Rule:
    inputs: tuple[Labels, ...]
    outputs: tuple[Labels, ...]
    sums: tuple[frozenset[str] | None, ...] = ()  # per result; None: every label it lacks
    no_partial: frozenset[str] = frozenset()
    additive: frozenset[int] = frozenset()
    extra: tuple[tuple[str, str, float], ...] = ()  # (label, collective, global bytes)
    linear: frozenset[int] = frozenset()  # arguments a Partial may pass through (to Partial results)
    one_partial: bool = False  # only one of the linear arguments at a time (a product: P·P is not a sum)
    gemm: tuple[str | None, str | None, str | None] = (None, None, None)  # labels of m, n, k (efficiency shape)
    scale_k: tuple[str, ...] = ()  # attention: labels whose split shrinks m (batch, heads, queries)
    sizes: dict[str, int] = field(default_factory=dict, compare=False)

    @property
    def labels(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for labels in (*self.inputs, *self.outputs):
            for lab in labels:
                if lab is not None:
                    seen.setdefault(lab, None)
        return tuple(seen)

    def result_sums(self, i: int) -> frozenset[str]:
        given = self.sums[i] if i < len(self.sums) else None
        if given is not None:
            return given
        return frozenset(self.labels) - set(self.outputs[i])


def replicated_rule(inputs: list[tuple[int, ...]], outputs: list[tuple[int, ...]]) -> Rule:
    """An op the planner has no rule for: every argument and result replicated (one strategy)."""
    return Rule(inputs=tuple((None,) * len(s) for s in inputs), outputs=tuple((None,) * len(s) for s in outputs))


def assignments(rule: Rule, sizes: tuple[int, ...], shapes_in: list[tuple[int, ...]],
                shapes_out: list[tuple[int, ...]]) -> list[tuple[str | None, ...]]:
    """Every valid strategy of an anchor op: one label (or none) per mesh dimension, each tensor split evenly; an
    op linear in its first argument may also carry a Partial through (``PASS``: add P + P, a view of P). A new
    list each call, of ``_assigned``'s memoised answer (Llama-3-8B on 64 H100s: 136 nodes, 62 distinct)."""
    return list(_assigned(rule, sizes, tuple(shapes_in), tuple(shapes_out)))


@lru_cache(maxsize=4096)
def _assigned(rule: Rule, sizes: tuple[int, ...], shapes_in: tuple[tuple[int, ...], ...],
              shapes_out: tuple[tuple[int, ...], ...]) -> tuple[tuple[str | None, ...], ...]:
    """``assignments``' strategies, kept by the rule's value and the mesh's sizes and the shapes they split."""
    passes = [passing(j) for j in sorted(rule.linear)] if rule.one_partial else [PASS] if rule.linear else []
    barred = _barred(rule)  # product() of the others: the allowed combos, in the same order
    options: list[str | None] = [lab for lab in (None, *rule.labels, *passes) if lab not in barred]
    return tuple(combo for combo in product(options, repeat=len(sizes)) if _fits(rule, combo, sizes, shapes_in,
                                                                                  shapes_out))


def _barred(rule: Rule) -> frozenset[str]:
    """The ``no_partial`` labels a result sums over: a strategy that splits one is not allowed."""
    outputs = range(len(rule.outputs))
    return frozenset(lab for lab in rule.no_partial if any(lab in rule.result_sums(i) for i in outputs))


def _fits(rule: Rule, combo: tuple[str | None, ...], sizes: tuple[int, ...], shapes_in: tuple[tuple[int, ...], ...],
          shapes_out: tuple[tuple[int, ...], ...]) -> bool:
    ins, outs = place(rule, combo)
    return all(valid(s, p, sizes) for s, p in zip(shapes_in, ins, strict=True)) and all(
        valid(s, p, sizes) for s, p in zip(shapes_out, outs, strict=True))


def place(rule: Rule, combo: tuple[str | None, ...], leader: int = -1
          ) -> tuple[tuple[Placements, ...], tuple[Placements, ...]]:
    """``_place``, memoised: the same rules and strategies recur on every (sub-)mesh the planner builds. Looked up
    by the rule's identity first (``_BY_ID``, the rule held beside it so its id is not reused: kept.Kept):
    hashing a Rule hashes its ten fields, and an op's rule is asked for each of its node's strategies (Llama-3-8B on
    64 H100s: 11 000 calls, 140 distinct rules)."""
    return _BY_ID.answer((id(rule), combo, leader), rule, _placed, rule, combo, leader)


_BY_ID: Kept[tuple[tuple[Placements, ...], tuple[Placements, ...]]] = Kept(65536)


@lru_cache(maxsize=65536)
def _placed(rule: Rule, combo: tuple[str | None, ...], leader: int
            ) -> tuple[tuple[Placements, ...], tuple[Placements, ...]]:
    ins, outs = _place(rule, combo, leader)
    return tuple(ins), tuple(outs)


def _place(rule: Rule, combo: tuple[str | None, ...], leader: int = -1) -> tuple[list[Placements], list[Placements]]:
    """The placements of every argument and result under a strategy (see the module docstring); under ``PASS`` the
    additive arguments and the ``leader`` are Partial (an anchor, ``leader`` -1: its linear arguments, the first
    only of a product; under ``passing(j)`` argument j), the others (a multiplier, an index) replicated."""
    partial_args = set(rule.additive) | ({leader} if leader >= 0 else (
        {min(rule.linear)} if rule.one_partial and rule.linear else set(rule.linear)))
    outs = []
    partial_at = set()
    for i, labels in enumerate(rule.outputs):
        sums = rule.result_sums(i)
        places = []
        for m, lab in enumerate(combo):
            if is_pass(lab) or (lab is not None and lab not in labels and lab in sums):
                places.append(PARTIAL)
                partial_at.add(m)
            else:
                places.append(labels.index(lab) if lab is not None and lab in labels else REPLICATE)
        outs.append(tuple(places))
    ins = []
    for i, labels in enumerate(rule.inputs):
        places = []
        for m, lab in enumerate(combo):
            if is_pass(lab):
                carried = partial_args if _passed(lab) < 0 else {_passed(lab)}
                places.append(PARTIAL if i in carried else REPLICATE)
            elif lab is not None and lab in labels:
                places.append(labels.index(lab))
            elif m in partial_at and i in rule.additive:
                places.append(PARTIAL)
            else:
                places.append(REPLICATE)
        ins.append(tuple(places))
    return ins, outs


def follow(rule: Rule, leader: int, placements: Placements) -> tuple[str | None, ...]:
    """A follower's strategy from its leading argument's placements (Alpa §4.2: element-wise ops, views and copies
    merge into their operand): Shard(d) becomes the label of d, Partial passes where the op is linear in the leader;
    anything else (a split dimension the op cannot keep split, a Partial into a non-linear op) is replicated first,
    and the move to it is charged to the edge."""
    labels = rule.inputs[leader]
    combo: list[str | None] = []
    for p in placements:
        if 0 <= p < len(labels) and labels[p] is not None:
            combo.append(labels[p])
        elif p == PARTIAL and leader in rule.linear:
            combo.append(PASS)
        else:
            combo.append(None)
    return tuple(combo)


@lru_cache(maxsize=65536)
def split_factor(combo: tuple[str | None, ...], sizes: tuple[int, ...], labels: frozenset[str] | None = None) -> int:
    """Devices that share an op's work: the mesh dimensions that split one of its labels (``labels``: only those).
    Memoised: the strategies of all ops share a few label names (Llama-3-8B on 64 H100s: 4,158 calls, 188 distinct)."""
    n = 1
    for lab, size in zip(combo, sizes, strict=True):
        if lab is not None and not is_pass(lab) and (labels is None or lab in labels):
            n *= size
    return n
