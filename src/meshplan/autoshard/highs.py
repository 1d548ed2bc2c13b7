"""The LP relaxation of ilp.py handed to HiGHS through the bindings SciPy ships (``scipy.optimize._highspy._core``),
the same HiGHS build, model and options as ``scipy.optimize.linprog(method="highs")`` gives it, without linprog's
per-column Python work around the solve.

linprog's wrapper (scipy/optimize/_highspy/_highs_wrapper.py @ SciPy 1.17.1) reads the basis status of every column
back into Python after the solve to report the bounds' marginals, which ilp.py never uses: with 75 000 columns a
program (Llama-3-8B on 64 GPUs) that loop took a third of each solve. Here the model goes in as linprog would pass
it (its inequality rows first, then its equalities; bounds [0, 1]; presolve off, HiGHS' dual simplex, one thread,
no output), so HiGHS runs the same iterations and returns the same vertex, and only the primal values and the
objective come back. Where the bindings are missing (another SciPy) or HiGHS ends anything but optimal, ``relax``
returns None and ilp.py asks linprog itself, which reports every status as it always has.

Warm starts (``warm_starts``: solve.plan's scope, one plan's Lagrangian rounds): a program whose constraints are
those of one solved before in the scope (the same matrix and bounds, only the costs differ: the price of memory or
the passes' weights moved, and reduce.py kept the same strategies) starts HiGHS' simplex from that program's
optimal basis, which is still primal feasible, instead of the slack basis (Llama-3-8B on 64 GPUs: about 770
iterations instead of 3 500 for such a round). The optimum's value is the same; where it has several optimal
vertices, HiGHS may end at another of them, the same one on every run (the scope starts empty each plan).

A round whose constraints are new (reduce.py kept other strategies, or folded other nodes) starts from the scope's
last optimal basis carried over by name (``Names``, ilp.names; ``_carried``). Llama-3-8B on 64 H100s: 19 200
iterations over the 14 rounds of the plan and its program as written instead of 33 400, the same objectives and plans
(16 900 where the program as written starts from the plan's first round, ``warm_starts(start)``). Small costs (a
small model's seconds) are scaled up by a power of two (ilp._unit): HiGHS' tolerances are absolute.

Programs solved before (``_solved_path``): each program's optimal basis is kept on disk beside the presets' traces
(trace_cache.py's folder, ``bases/``; ``MESHPLAN_CACHE=off`` keeps none), named by a digest of the program (constraints
and costs), of the code that chose its warm starts (``SOLVED_BY``) and of HiGHS' version. The same program solved
again starts at that basis, which is optimal: HiGHS ends there with no iteration, at the vertex the first solve ended
at, so the plan is a cold run's, round by round (Llama-3-8B on 64 H100s planned again: HiGHS 0 iterations instead of
16 900, about 0.3 instead of 2.6 CPU seconds on a loaded machine). A record not of this program's size is not read;
any basis is only a start (a wrong one costs iterations, never the optimum). Beside each basis, its round's answer is
kept (``kept_round``), named by the round's input before reduce.py: a request planned again neither reduces nor solves
its rounds (about half the process's CPU), and where a round is not kept, the rounds read before it are solved first,
so that its warm start is a cold run's.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from meshplan.autoshard.matrix import Coo, Csc
from meshplan.autoshard.trace_cache import cache_dir, code_digest, write_whole


@dataclass(frozen=True, kw_only=True)
class Relaxed:
    """An optimal LP relaxation: linprog's ``status``, ``x`` and ``fun`` as ilp.py reads them."""

    x: np.ndarray
    fun: float
    status: int = 0  # linprog's code for optimal


@dataclass(frozen=True, kw_only=True)
class Names:
    """A name (int64) per column and per row of a program, equal for the same variable or constraint in another
    program of the scope (ilp.names): a basis is carried over by them."""

    cols: np.ndarray
    rows: np.ndarray


_CORE = "scipy.optimize._highspy._core"


def _bindings() -> Any:
    """HiGHS' bindings as SciPy ships them, loaded from SciPy's own file without running scipy.optimize's package
    (which imports scipy.linalg, .sparse, .special and .fft: about half a second) where that is not loaded yet;
    None where this SciPy has another layout (linprog answers instead)."""
    core = sys.modules.get(_CORE)
    if core is None:
        try:
            core = _load_core()
        except ImportError:  # another SciPy's layout: linprog instead
            return None
    return core if core is not None and hasattr(core, "_Highs") and hasattr(core, "HighsLp") else None


def _load_core() -> Any:
    if "scipy.optimize" in sys.modules:
        from scipy.optimize._highspy import _core

        return _core
    scipy = importlib.util.find_spec("scipy")
    if scipy is None or not scipy.submodule_search_locations:
        return None
    folder = Path(next(iter(scipy.submodule_search_locations))) / "optimize" / "_highspy"
    found = [folder / f"_core{s}" for s in importlib.machinery.EXTENSION_SUFFIXES if (folder / f"_core{s}").exists()]
    if not found:
        return None
    spec = importlib.util.spec_from_file_location(_CORE, found[0])
    if spec is None or spec.loader is None:
        return None
    core = importlib.util.module_from_spec(spec)
    sys.modules[_CORE] = core  # where scipy.optimize is imported later, its _highspy finds this module
    spec.loader.exec_module(core)
    return core


_BASES: ContextVar[dict[bytes, Any] | None] = ContextVar("highs_bases", default=None)
_SOLVER: ContextVar[list[Any] | None] = ContextVar("highs_solver", default=None)  # the scope's one Highs object
# the scope's start, its optimal bases by name (``_kept``), the solves of its rounds read instead (``deferred``)
_NAMED: ContextVar[tuple[Any, list[Any], list[Callable[[], Any]]] | None] = ContextVar("highs_named", default=None)


NamedBasis = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # _kept's: names and states, sorted


@contextmanager
def warm_starts(start: NamedBasis | None = None) -> Iterator[list[NamedBasis]]:
    """A scope in which each program starts from the optimal basis of an earlier one with its constraints, or from
    the last one's by name (module docstring), the first from ``start`` where given; outside any scope, every program
    starts cold. Yields the scope's optimal bases by name, in the order solved."""
    solved: list[NamedBasis] = []
    token, named, solver = _BASES.set({}), _NAMED.set((start, solved, [])), _SOLVER.set([])
    try:
        yield solved
    finally:
        _BASES.reset(token)
        _NAMED.reset(named)
        _SOLVER.reset(solver)


def _solver(h: Any) -> Any:
    """The scope's one Highs object (outside a scope, a new one): passModel clears its basis, solution and simplex
    state and passOptions sets every option, so each program runs as in a new object, minus its making (Llama-3-8B
    on 64 H100s, a first request: 0.14 G of HiGHS' 3.5 G instructions)."""
    held = _SOLVER.get()
    if held is not None and not held:
        held.append(h._Highs())
    return h._Highs() if held is None else held[0]


def _constraints_key(*arrays: np.ndarray) -> bytes:
    h = hashlib.sha256()  # as reduce.digest: the processors' SHA extensions hash it fastest
    for a in arrays:
        h.update(np.asarray(a.shape, dtype=np.int64).tobytes() + a.dtype.str.encode())
        h.update(np.ascontiguousarray(a).data)  # the buffer itself: no copy of its bytes
    return h.digest()


def relax(c: np.ndarray, matrix: Any, lo: np.ndarray, hi: np.ndarray, names: Names | None = None) -> Relaxed | None:
    """min c·x with lo <= matrix·x <= hi and 0 <= x <= 1 (``matrix`` a scipy.sparse CSR), solved as linprog's
    ``A_ub`` (rows with lo < hi) and ``A_eq`` (lo == hi) with presolve off on one thread; None where linprog should
    answer instead (module docstring)."""
    h = _bindings()
    if h is None:
        return None
    eq = lo == hi
    indptr, indices, data = _columns(matrix, eq)
    lhs = np.concatenate((np.full(int((~eq).sum()), -h.kHighsInf), lo[eq]))
    rhs = np.concatenate((np.minimum(hi[~eq], h.kHighsInf), hi[eq]))
    highs = _solver(h)
    options = h.HighsOptions()
    for name, value in (("presolve", "off"), ("threads", 1), ("output_flag", False), ("log_to_console", False),
                        ("simplex_strategy", h.simplex_constants.SimplexStrategy.kSimplexStrategyDual),
                        ("highs_debug_level", h.HighsDebugLevel.kHighsDebugLevelNone)):
        setattr(options, name, value)
    if highs.passOptions(options) == h.HighsStatus.kError:
        return None
    # the model as arrays (linprog's wrapper fills a HighsLp column by column through Python lists): minimise, no
    # offset, column-wise matrix, every column continuous
    n, costs = len(c), np.ascontiguousarray(c, dtype=float)
    if highs.passModel(n, len(lhs), len(data), int(h.MatrixFormat.kColwise), int(h.ObjSense.kMinimize), 0.0,
                       costs, np.zeros(n), np.ones(n), lhs, rhs, indptr, indices, data,
                       np.zeros(n, dtype=np.int32)) == h.HighsStatus.kError:
        return None
    bases, folder = _BASES.get(), _solved_dir()
    key = _constraints_key(indptr, indices, data, lhs, rhs) if bases is not None or folder is not None else b""
    path = None if folder is None else _solved_path(folder, key, costs)
    order = None if names is None else np.concatenate((names.rows[~eq], names.rows[eq]))  # HiGHS' row order
    kept = _read_solved(h, path, n, len(lhs))
    if kept is None or highs.setBasis(kept) == h.HighsStatus.kError:
        kept = None
        _warm(h, highs, key, None if names is None else names.cols, order)
    if highs.run() == h.HighsStatus.kError or highs.getModelStatus() != h.HighsModelStatus.kOptimal:
        return None
    x = np.fromiter(highs.getSolution().col_value, float, n)  # the bindings give a list: no dtype to discover
    states = _states(highs, x, len(lhs), len(lhs) - int(eq.sum()))
    if path is not None and (kept is None or highs.getInfo().simplex_iteration_count):
        write_whole(path, np.concatenate(states).tobytes())
    scope = _NAMED.get()
    if bases is not None:
        bases[key] = highs.getBasis()
        if scope is not None and names is not None and order is not None:
            scope[1].append(_kept(*states, names.cols, order))
    return Relaxed(x=x, fun=float(highs.getInfo().objective_function_value))


def _warm(h: Any, highs: Any, key: bytes, cols: np.ndarray | None, order: np.ndarray | None) -> None:
    """Inside ``warm_starts``: start from the optimal basis of a program with these constraints solved before in the
    scope, else from the last one's carried by name (module docstring); outside, the slack basis (a cold start). A
    basis HiGHS refuses leaves the slack basis."""
    bases, scope = _BASES.get(), _NAMED.get()
    if bases is None:
        return
    if key in bases:
        _started(h, highs, bases[key])
        return
    last = None if scope is None else scope[1][-1] if scope[1] else scope[0]
    if callable(last):  # a plan's first round read, not solved (``first_basis``)
        last = last()
    if last is not None and cols is not None and order is not None:
        _started(h, highs, _carried(h, last, cols, order))


def _started(h: Any, highs: Any, basis: Any) -> None:
    """Start from ``basis`` (another round's optimum), the costs unperturbed: HiGHS' dual simplex perturbs the costs
    by default (HighsOptions.h, ``dual_simplex_cost_perturbation_multiplier`` 1) against stalling from the slack
    basis; from a basis near the optimum that only costs the iterations that remove it (Llama-3-8B on 64 H100s, a
    first request: 13 warm rounds 5 300 iterations instead of 11 400). The optimum's value is the same; where it
    has several optimal vertices, another may be returned. The cold first round keeps the default."""
    if highs.setBasis(basis) != h.HighsStatus.kError:
        highs.setOptionValue("dual_simplex_cost_perturbation_multiplier", 0.0)


SOLVED_BY = ("autoshard/highs.py", "autoshard/ilp.py", "autoshard/matrix.py", "autoshard/reduce.py",
             "autoshard/dominance.py", "autoshard/solve.py", "autoshard/as_written.py")  # whose warm starts decide a
# program's optimal vertex (matrix.py: the order of its columns and rows, and the edge rows its names are read from)


def _solved_dir() -> Path | None:
    folder = cache_dir()
    return None if folder is None else folder / "bases"


def _solved_path(folder: Path, constraints: bytes, costs: np.ndarray) -> Path:
    """Where a program's optimal basis is kept (module docstring): named by a digest of the program (its constraints'
    digest and its costs), of the code whose warm starts chose that optimal vertex (``SOLVED_BY``) and of HiGHS'
    version."""
    global _VERSION
    if _VERSION is None:
        core = _bindings()
        _VERSION = code_digest(SOLVED_BY) + str(tuple(getattr(core, f"HIGHS_VERSION_{p}", 0)
                                                      for p in ("MAJOR", "MINOR", "PATCH"))).encode()
    return folder / f"{hashlib.sha256(_VERSION + constraints + _constraints_key(costs)).hexdigest()}.basis"


_VERSION: bytes | None = None


def _read_solved(h: Any, path: Path | None, cols: int, rows: int) -> Any:
    """The basis kept at ``path`` (its columns' then its rows' states, a byte each: ``_states``), or None (none kept,
    or not one of this program's size)."""
    try:
        states = np.fromfile(path, dtype=np.int8) if path is not None and path.is_file() else None
    except OSError:
        return None
    if states is None or len(states) != cols + rows or states.min(initial=0) < 0 or states.max(initial=0) > 4:
        return None
    basis = h.HighsBasis()
    basis.col_status = _statuses(h, states[:cols])
    basis.row_status = _statuses(h, states[cols:])
    basis.valid = True
    return basis


def _states(highs: Any, x: np.ndarray, rows: int, inequalities: int) -> tuple[np.ndarray, np.ndarray]:
    """The optimal basis' states in HiGHS' order, HighsBasisStatus' values: 0 at the lower bound, 1 basic, 2 at the
    upper bound (a column at 1, an inequality row at its limit; an equality row's either bound is its value). Read
    from the basic variables' indices rather than the basis' list of statuses (a Python object each)."""
    basic = np.asarray(highs.getBasicVariables()[1], dtype=np.int64)
    col_state = np.where(x > 0.5, 2, 0).astype(np.int8)
    col_state[basic[basic >= 0]] = 1
    row_state = np.zeros(rows, dtype=np.int8)
    row_state[:inequalities] = 2
    row_state[-1 - basic[basic < 0]] = 1
    return col_state, row_state


def _kept(col_state: np.ndarray, row_state: np.ndarray, cols: np.ndarray, rows: np.ndarray) -> tuple:
    """The optimal basis by name (``_states``), sorted."""
    c, r = np.argsort(cols, kind="stable"), np.argsort(rows, kind="stable")  # names are unique: any sort's order; a
    # stable one (timsort) runs through the names' long ascending runs in a third of quicksort's time
    return cols[c], col_state[c], rows[r], row_state[r]


def _carried(h: Any, named: tuple, cols: np.ndarray, rows: np.ndarray) -> Any:
    """An alien basis for this program from the last one by name (``_kept``: a node's strategy by its original index,
    an edge's class by its first strategy, a row by its node or edge, side and class): a variable or constraint of
    both keeps its state, a new column starts at its lower bound and a new row's slack basic; HiGHS makes it a basis
    (HighsBasis.alien: its count of basic variables, a nonsingular matrix) before the simplex starts."""
    basis = h.HighsBasis()
    for side, (names, default) in enumerate(((cols, 0), (rows, 1))):
        old, state = named[2 * side], named[2 * side + 1]
        at = np.minimum(np.searchsorted(old, names), len(old) - 1)
        found = np.where(old[at] == names, state[at], default)
        if side == 0:
            basis.col_status = _statuses(h, found)
        else:
            basis.row_status = _statuses(h, found)
    basis.alien = True
    basis.valid = True
    return basis


def _statuses(h: Any, codes: np.ndarray) -> list[Any]:
    """HighsBasisStatus' values ``codes`` as the list of the enum's objects the bindings take: the most frequent one
    repeated, the others put in at their places (a few thousand of 50 000 columns: a sixth of the time of an object
    array's gather and ``tolist``)."""
    counts = np.bincount(codes, minlength=1)
    fill = int(counts.argmax())
    made = [h.HighsBasisStatus(fill)] * len(codes)
    for value in np.flatnonzero(counts).tolist():
        if value != fill:
            status = h.HighsBasisStatus(value)
            for i in np.flatnonzero(codes == value).tolist():
                made[i] = status
    return made


def _columns(matrix: Any, eq: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The matrix column-wise (CSC arrays) with linprog's row order: ``A_ub`` (rows with lo < hi) above ``A_eq``."""
    if isinstance(matrix, (Coo, Csc)):
        position = np.empty(len(eq), dtype=np.int64)
        position[~eq] = np.arange(int((~eq).sum()))
        position[eq] = int((~eq).sum()) + np.arange(int(eq.sum()))
        return matrix.csc(None if eq.all() else position)
    from scipy.sparse import vstack

    a = vstack((matrix[~eq], matrix[eq])).tocsc() if not eq.all() else matrix.tocsc()
    return a.indptr.astype(np.int32), a.indices.astype(np.int32), a.data.astype(float)


# Rounds solved before (``kept_round``, module docstring): read back, a round is neither reduced nor solved; its solve
# is deferred (``deferred``) until a later round of the scope is not kept, then solved first, in order (``catch_up``,
# each from its kept basis: no iteration, the same vertex), so that the scope's warm starts are a run's without records.


def kept_round(key: bytes) -> tuple[Path | None, dict | None]:
    """Where the round of input digest ``key`` is kept, and its answer where it is (None: not kept, or no cache)."""
    folder = _solved_dir()
    if folder is None:
        return None, None
    path = _solved_path(folder, key, np.zeros(0)).with_suffix(".round")
    try:
        return path, json.loads(path.read_bytes()) if path.is_file() else None
    except (OSError, ValueError):
        return path, None


def keep_round(path: Path | None, answer: dict) -> None:
    if path is not None:
        write_whole(path, json.dumps(answer).encode())


def deferred(solve: Callable[[], Any]) -> None:
    """A round read instead of solved: its solve waits in the scope until a later round needs its warm start."""
    scope = _NAMED.get()
    if scope is not None:
        scope[2].append(solve)


def catch_up() -> None:
    """The scope's deferred solves, in order (before a round that is solved)."""
    scope = _NAMED.get()
    while scope is not None and scope[2]:
        scope[2].pop(0)()


def first_basis(start: Any) -> Any:
    """The scope's first optimal basis by name, solved later where its first round was read (a callable: as_written.py
    starts from it only where a round of its own is solved)."""
    scope = _NAMED.get()
    if scope is None or scope[1]:
        return scope[1][0] if scope else None
    if not scope[2]:
        return None
    first, answer = scope[2][0], []  # type: tuple[Callable[[], Any], list[Any]]

    def later() -> Any:
        if not answer:
            with warm_starts(start() if callable(start) else start) as solved:
                first()
            answer.append(solved[0] if solved else None)
        return answer[0]
    return later
