"""Every configuration a serving search weighed, as columns: what the report's configuration space draws
(report/serve_space.py). Kept only when asked (``search(..., keep=True)``): the search itself needs the best ones.

One row per deployment: its instance shape (tp, pp, dpa, ep, batch), its pools (replicas, prefill_replicas), its
quantisation scheme (``quant``: an index into ``quants``), the GPUs it uses, its TTFT, TPOT, end-to-end latency,
output tokens/s (all instances) and memory per GPU, as the search priced them (metrics.instance, metrics.deployment,
memory.memory: the same arrays), and ``reason``: -1 when it fits and meets the targets, else the index into
``reasons`` of the first constraint it breaks, in the search's order (check.py). A configuration broken before
pricing (divisibility, a format the GPU lacks) keeps what its arrays hold, which means nothing: read its reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

import numpy as np

from meshplan.serve.precision import Quant

SHAPE = ("tp", "pp", "dpa", "ep", "batch")
FIGURES = ("ttft", "tpot", "e2e", "tokens_per_s", "memory")


@dataclass(frozen=True)
class Weighed:
    """Deployments as columns, one row each (the module's docstring)."""

    columns: dict[str, np.ndarray]  # one row per deployment (module docstring)
    quants: tuple[Quant, ...]
    reasons: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.columns["tp"])


class Part(TypedDict):
    """One scheme's rows (``part``): its columns and the (reason, mask) pairs that break rows."""

    columns: dict[str, np.ndarray]
    bad: list[tuple[str, np.ndarray]]


def part(keys: dict[str, np.ndarray], quant: int, deploy: tuple[np.ndarray, ...],
         bad: Sequence[tuple[str, np.ndarray]], figures: dict[str, np.ndarray]) -> Part:
    """The rows of one scheme: ``deploy`` (key index, replicas, prefill replicas per deployment), ``bad`` the
    (reason, mask) pairs whose masks exclude each other, ``figures`` the priced arrays per deployment."""
    index, replicas, prefill = deploy
    cols: dict[str, np.ndarray] = {k: keys[k][index] for k in SHAPE}
    cols |= {"replicas": replicas, "prefill_replicas": prefill, "quant": np.full(len(index), quant)}
    cols["gpus"] = cols["tp"] * cols["pp"] * cols["dpa"] * (replicas + prefill)
    cols |= {k: np.asarray(figures[k], dtype=float) for k in FIGURES}
    return {"columns": cols, "bad": [(r, np.asarray(m, dtype=bool)) for r, m in bad]}


def join(parts: Sequence[Part], quants: tuple[Quant, ...]) -> Weighed:
    """The schemes' rows as one table, each row's first broken constraint as an index into ``reasons``."""
    reasons: list[str] = []
    columns: dict[str, list[np.ndarray]] = {}
    for p in parts:
        cols = p["columns"]
        reason = np.full(len(cols["tp"]), -1)
        for text, mask in p["bad"]:
            if text not in reasons:
                reasons.append(text)
            reason = np.where(mask & (reason < 0), reasons.index(text), reason)
        for k, v in (cols | {"reason": reason}).items():
            columns.setdefault(k, []).append(v)
    return Weighed({k: np.concatenate(v) for k, v in columns.items()}, quants, tuple(reasons))
