"""Exact reductions of the program before HiGHS sees it: the pairwise form (node costs, edge matrices) shrinks
without changing its optimum.

- Strategies a node may not take (``allowed``) are dropped.
- Dominated strategies are dropped: a is dominated by b when b costs no more at the node, no more on every incident
  edge against every neighbour strategy, and holds no more bytes of any storage (so no memory constraint prefers a);
  of identical strategies one is kept. Once none applies, Goldstein's criterion at each node left (dead-end
  elimination: Desmet et al. 1992, Nature 356; Goldstein 1994, "Efficient rotamer elimination applied to protein
  side-chains and related spin glasses", Biophys. J. 66): a goes where some b left gives
  c_b − c_a + Σ_(edges) max_j (R[b, j] − R[a, j]) <= 0 and holds no more bytes, for then moving any share of a (a
  strategy, or an LP relaxation's fraction, with its edge variables row for row) to b never costs more: neither the
  optimum nor the LP relaxation's optimum changes (an optimum may leave a tie); then the plain reductions again.
  Llama-3-8B on 64 H100s: programs of 42 000-60 000 columns instead of 73 000-75 000.
- A node left with one strategy and no bytes is folded into its neighbours whatever their number (its edges become
  their costs).
- A node that holds no memory and has one neighbour is folded into it: c_u[a] += min_b (c_v[b] + R_uv[a, b]); one
  with two neighbours becomes an edge between them: R_uw[a, c] += min_b (c_v[b] + R_uv[a, b] + R_vw[b, c]) (the
  leaf and series reductions of partitioned boolean quadratic problems, Scholz & Eckstein 2002, "Register
  allocation for irregular architectures", §4; the same that solve Alpa-style sharding graphs of chains quickly).
  Its choice is read back from the neighbours' once they are solved (``expand_choice``).

Nodes that create storages keep their variables: their bytes enter the memory constraints linearly, which an
eliminated node's (chosen by its neighbours) would not.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import numpy as np

from meshplan.autoshard.dominance import Rest, goldstein, kept


@dataclass
class Pairwise:
    """min Σ_v c_v[s_v] + Σ_(u,v) R_uv[s_u, s_v], strategies renumbered (``ids``: reduced -> original index)."""

    costs: dict[int, np.ndarray]
    edges: dict[tuple[int, int], np.ndarray]  # u < v
    memory: dict[int, np.ndarray]  # node -> (strategies, storages) bytes; absent: holds none
    ids: dict[int, np.ndarray]
    history: list[tuple] = field(default_factory=list)
    constant: float = 0.0  # the cost of nodes eliminated with no neighbour

    def neighbours(self) -> dict[int, set[int]]:
        found: dict[int, set[int]] = {k: set() for k in self.costs}
        for u, v in self.edges:
            found[u].add(v)
            found[v].add(u)
        return found

    def matrix(self, u: int, v: int) -> np.ndarray:
        """R_uv with rows u's strategies, columns v's."""
        return self.edges[(u, v)] if u < v else self.edges[(v, u)].T

    def add(self, u: int, v: int, m: np.ndarray) -> None:
        key, m = ((u, v), m) if u < v else ((v, u), m.T)
        self.edges[key] = same(("add",), (self.edges[key], m), np.add) if key in self.edges else m


MEMO = 8192  # profiles remembered: the planner's Lagrangian rounds solve programs that differ at a few nodes only
_KEPT: dict[bytes, np.ndarray] = {}
# the indices kept, one object for equal ones: a node whose profile is new (its cost priced again by a Lagrangian
# round) but that keeps what it kept before restricts its edges by the same object, so ``same`` hands its neighbours
# the same edge arrays back and their profiles are met by identity (Llama-3-8B on 64 H100s, a first request's 14
# reductions replayed: 2 811 profiles looked up by digest instead of 3 548, 154 M instructions fewer of 2.49 G)
_INDICES: dict[bytes, np.ndarray] = {}


def digest(m: np.ndarray) -> bytes:
    """A SHA-256 digest of a matrix's shape, dtype and bytes: equal for equal matrices, and for different ones with
    probability 2^-256 a pair (the key of ``_KEPT`` and of ilp.py's edge classes). SHA-256 rather than BLAKE2: the
    processors' SHA extensions (x86 SHA-NI, Armv8's) hash it about twice as fast (1.2 against 0.6 GB/s here)."""
    h = hashlib.sha256(np.asarray(m.shape, dtype=np.int64).tobytes() + m.dtype.str.encode())
    h.update(np.ascontiguousarray(m).data)  # the buffer itself: no copy of its bytes
    return h.digest()


def restrict(pw: Pairwise, key: int, keep: np.ndarray, near: set[int] | None = None) -> None:
    """Keep only the strategies ``keep`` (reduced indices) of node ``key``; ``near``: its neighbours, where the
    caller knows them (else every edge is looked at). The arrays kept are ``same``'s: the same objects for the same
    arrays and ``keep``."""
    pw.costs[key] = same(("take",), (pw.costs[key], keep), lambda c, k: c[k])
    pw.ids[key] = pw.ids[key][keep]
    if key in pw.memory:
        pw.memory[key] = pw.memory[key][keep]
    pairs = list(pw.edges) if near is None else [(key, v) if key < v else (v, key) for v in near]
    for u, v in pairs:
        if u == key:
            pw.edges[(u, v)] = same(("rows",), (pw.edges[(u, v)], keep), lambda m, k: m[k, :])
        elif v == key:
            pw.edges[(u, v)] = same(("cols",), (pw.edges[(u, v)], keep), lambda m, k: m[:, k])


_SAME: dict[tuple, tuple[tuple, Any]] = {}  # (operation, ids of its arguments) -> (the arguments, the result)


def same(op: tuple, args: tuple, compute: Callable[..., Any]) -> Any:
    """``compute(*args)``, or the very object it returned before for the same argument objects. The program's arrays
    are replaced, never written (ilp.py, and here), so an object's value never changes; the arguments are kept
    beside the result, so their ids are not reused while it is remembered. A plan's Lagrangian rounds price memory
    at a few nodes only (Llama-3-8B on 64 H100s: 35 of 166): elsewhere each round repeats the last one's reductions
    on the same arrays, and gets the same objects back, which ``_dominated`` then recognises by identity alone. A
    new result equal to one made before (other arguments, the same array) is that one (``_one``): what follows it is
    met by identity too (a first request of Llama-3-8B on 64 H100s, its 14 reductions replayed: 2 505 profiles
    looked up by digest instead of 2 811, 78 M instructions fewer of 2.34 G)."""
    tag = (*op, *map(id, args))
    hit = _SAME.get(tag)
    if hit is not None:  # its arguments, kept alive beside it, hold these ids: they are these objects
        return hit[1]
    out = compute(*args)
    out = tuple(map(_one, out)) if isinstance(out, tuple) else _one(out)
    if len(_SAME) > MEMO:  # the older half goes (a dict keeps the order of insertion): the last rounds' stay
        for old in list(islice(_SAME, MEMO // 2)):
            del _SAME[old]
    _SAME[tag] = (args, out)
    return out


def _one(m: Any) -> Any:
    """The array first made equal to ``m`` (its digest's, ``known_digest``), or ``m``; anything else as it is."""
    if not isinstance(m, np.ndarray):
        return m
    found = _ONE.setdefault(known_digest(m), m)
    if len(_ONE) > MEMO:
        _ONE.clear()
    return found


_ONE: dict[bytes, np.ndarray] = {}


def _dominated(pw: Pairwise, key: int, around: set[int], strong: bool = False) -> np.ndarray:
    """Indices kept after dropping dominated and duplicate strategies of ``key``: in lexicographic order of their
    profiles (cost, edge rows, bytes), each strategy that no strategy kept before it beats (costs no more, to within
    1e-15, everywhere). Which strategy beats which is one array; only a strategy beaten by one before it in the order
    can be dropped, and those are decided in order. ``strong``: Goldstein's criterion instead (dominance.goldstein)."""
    near = sorted(around)
    edges = pw.edges
    arrays: list[Any] = [pw.costs[key], pw.memory.get(key)]
    sides: list[Any] = ["strong" if strong else "plain"]
    for v in near:  # one pass (not two generators): most calls end at ``same``'s look-up by identity
        first = key < v
        arrays.append(edges[(key, v)] if first else edges[(v, key)])
        sides.append(first)
    return same(tuple(sides), tuple(arrays), lambda *_: _profiled(pw, key, near, strong))


def _profiled(pw: Pairwise, key: int, near: list[int], strong: bool) -> np.ndarray:
    """``_dominated`` of a profile not met by identity: remembered by its parts' digests (``known_digest``: an array
    met before is not hashed again; the profile is built only where the digests are new). Its columns but the cost
    (the edge blocks and the bytes) are remembered apart (``_rest``): a Lagrangian round reprices a node's cost and
    leaves its edges and bytes, so half the profiles met anew have a rest met before (Llama-3-8B on 64 H100s, a
    first request: 1 156 of 2 199), and those compare their costs only."""
    pairs = [(key, v) if key < v else (v, key) for v in near]
    tags = [known_digest(pw.edges[p]) + (b"r" if p[0] == key else b"c") for p in pairs]
    held = pw.memory.get(key)
    cost = pw.costs[key]
    rest_tag = b"".join((b"%d:" % len(cost), *tags, b"" if held is None else digest(held)))  # rows: a rest may be empty
    tag = b"".join((b"G" if strong else b"P", known_digest(cost), rest_tag))
    known = _KEPT.get(tag)
    if known is None:
        rest = _rest(pw, key, near, held, rest_tag)
        if strong:
            known = goldstein(cost, rest, [_worst(pw.edges[p], t) for p, t in zip(pairs, tags, strict=True)])
        else:
            known = kept(cost, rest, rest.no_more & (cost[:, None] <= cost[None, :] + 1e-15))
        known = _KEPT[tag] = _INDICES.setdefault(known.tobytes(), known)
        if len(_KEPT) > MEMO:
            _KEPT.clear()
            _INDICES.clear()
            _REST.clear()
    return known


def _rest(pw: Pairwise, key: int, near: list[int], held: np.ndarray | None, tag: bytes) -> Rest:
    """``Rest`` of a node's profile, remembered by its parts' digests (``tag``)."""
    hit = _REST.get(tag)
    if hit is None:
        blocks = [pw.matrix(key, v) for v in near]
        columns = np.concatenate([np.zeros((len(pw.costs[key]), 0)), *blocks, *(() if held is None else (held,))],
                                 axis=1)
        hit = _REST[tag] = Rest(columns, 0 if held is None else held.shape[1])
    return hit


_REST: dict[bytes, Rest] = {}  # a profile's rest's digests -> Rest


def known_digest(m: np.ndarray) -> bytes:
    """An array's digest (``digest``), by its identity first (kept beside it, as ``same`` keeps its arguments): most
    of a profile's arrays are a last round's, and the program HiGHS is given is made of arrays profiled here."""
    hit = _PARTS.get(id(m))
    if hit is not None and hit[0] is m:
        return hit[1]
    if len(_PARTS) > MEMO:
        _PARTS.clear()
    found = _PARTS[id(m)] = (m, digest(m))
    return found[1]


_PARTS: dict[int, tuple[np.ndarray, bytes]] = {}  # id -> (the array, its digest)


_WORST: dict[bytes, np.ndarray] = {}  # an edge matrix's digest and side -> ``_worst``


def _worst(stored: np.ndarray, tag: bytes) -> np.ndarray:
    """max_j (R[b, j] − R[a, j]) for each pair (a, b) of a node's rows of one edge (inf − inf: 0, both impossible
    there), R the ``stored`` matrix or its transpose (``tag``: its digest and the node's side, ``_profiled``), kept by
    ``tag``: a Lagrangian round moves the nodes' costs, its edges far less often."""
    hit = _WORST.get(tag)
    if hit is None:
        block = stored if tag.endswith(b"r") else stored.T
        if block.shape[1]:
            diff = block[None, :, :] - block[:, None, :]  # [a, b, j]: R[b, j] - R[a, j]
            hit = (diff if np.isfinite(block).all() else np.where(np.isnan(diff), 0.0, diff)).max(axis=2)
        else:
            hit = np.zeros((len(block), len(block)))
        _WORST[tag] = hit
        if len(_WORST) > MEMO:
            _WORST.clear()
    return hit


def reduce(pw: Pairwise) -> Pairwise:
    """Apply the reductions (module docstring) until none applies: plain dominance and the eliminations first, then
    Goldstein's criterion too (dearer to test; tested at the nodes left). Dominance is tested again only at the nodes
    whose costs or edges changed since their last test (``dirty``): a node's strategies that survived it survive it
    again on the same profile (each was beaten by none kept before it, and the same ones are kept before it)."""
    around, dirty = pw.neighbours(), set()
    _reduce(pw, set(pw.costs), around)
    for key in list(pw.costs):  # Goldstein's criterion once at each node left
        keep = _dominated(pw, key, around[key], strong=True)
        if len(keep) < len(pw.costs[key]):
            restrict(pw, key, keep, around[key])
            dirty |= around[key] | {key}
    if dirty:
        _reduce(pw, dirty, around)
    return pw


def _reduce(pw: Pairwise, dirty: set[int], around: dict[int, set[int]]) -> None:
    """``reduce``'s plain reductions; ``around``: every node's neighbours (``Pairwise.neighbours``), which
    ``_eliminate`` keeps up to date."""
    changed = True
    while changed:
        changed = False
        for key in list(pw.costs):
            if key not in dirty:
                continue
            dirty.discard(key)
            keep = _dominated(pw, key, around[key])
            if len(keep) < len(pw.costs[key]):
                restrict(pw, key, keep, around[key])
                dirty |= around[key]  # their edges to this node lost rows
                changed = True
        for key in sorted(pw.costs, key=lambda k: len(around[k])):
            if key in pw.memory or key not in pw.costs or len(around[key]) > 2 and len(pw.costs[key]) > 1:
                continue
            dirty |= around[key]  # their costs or edges take this node's in
            _eliminate(pw, key, sorted(around[key]), around)
            changed = True


def _eliminate(pw: Pairwise, v: int, near: list[int], around: dict[int, set[int]]) -> None:
    """Fold node ``v`` into its ``near`` neighbours (none, one or two; any number where it has one strategy left: the
    module docstring); ``around`` (every node's neighbours) is kept up to date."""
    c = pw.costs.pop(v)
    ids = pw.ids.pop(v)
    del around[v]
    for u in near:
        around[u].discard(v)
    if near and len(c) == 1:  # one strategy: its edges' one column is each neighbour's cost
        for u in near:
            pw.costs[u] = same(("one", u < v), (pw.costs[u], pw.edges[(u, v) if u < v else (v, u)]),
                                lambda cost, edge, first=u < v: cost + (edge[:, 0] if first else edge[0, :]))
            pw.edges.pop((u, v) if u < v else (v, u))
        near = []
    if len(near) == 2:  # the series reduction joins the two
        around[near[0]].add(near[1])
        around[near[1]].add(near[0])
    if not near:
        pw.history.append((v, ids, int(np.argmin(c))))
        pw.constant += float(c.min())
        return
    mats = [pw.matrix(u, v) for u in near]
    stored = tuple(pw.edges.pop((u, v) if u < v else (v, u)) for u in near)  # the objects ``same`` knows
    if len(near) == 1:
        cost, best = same(("leaf", near[0] < v), (pw.costs[near[0]], c, *stored),
                           lambda cost, c, _: _leaf(cost, mats[0] + c[None, :]))
        pw.costs[near[0]] = cost
        pw.history.append((v, ids, (near[0], pw.ids[near[0]].copy()), best))
        return
    u, w = near
    joined, best = same(("series", u < v, w < v), (c, *stored), lambda c, *_: _series(mats[0], c, mats[1]))
    pw.add(u, w, joined)
    pw.history.append((v, ids, (u, pw.ids[u].copy()), (w, pw.ids[w].copy()), best))


def _leaf(cost: np.ndarray, total: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A leaf's neighbour's new costs and the leaf's best strategy for each of its strategies."""
    return cost + total.min(axis=1), total.argmin(axis=1)


def _series(left: np.ndarray, c: np.ndarray, right: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The edge a node of two neighbours leaves between them, and its best strategy for each pair of theirs."""
    total = left[:, :, None] + c[None, :, None] + right.T[None, :, :]  # (a, b, c)
    return total.min(axis=1), total.argmin(axis=1)


def expand_choice(pw: Pairwise, choice: dict[int, int]) -> dict[int, int]:
    """Original strategy indices of every node, eliminated ones read back in reverse order (their neighbours'
    choices located among the strategies those had when the node was eliminated; dominance may have dropped some
    since). ``choice`` holds the reduced indices of the nodes left."""
    original = {k: int(pw.ids[k][a]) for k, a in choice.items()}

    def at(record: tuple[int, np.ndarray]) -> int:
        key, ids = record
        return int(np.flatnonzero(ids == original[key])[0])

    for record in reversed(pw.history):
        v, ids = record[0], record[1]
        if len(record) == 3:
            local = record[2]
        elif len(record) == 4:
            local = int(record[3][at(record[2])])
        else:
            local = int(record[4][at(record[2]), at(record[3])])
        original[v] = int(ids[local])
    return original
