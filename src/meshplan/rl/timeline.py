"""One iteration as a timeline: each phase a segment on a pool, the iteration's time where both pools are done.

- colocated (one pool, ``all``): in verl's order (ray_trainer.py ``fit``: generate, reward, old log-prob, reference,
  values, critic update, actor update; the hybrid engine's rollout_mode / trainer_mode switches around
  ``generate_sequences``): the trainer's state to the host, the engine's wake, the weight transfer, the rollout, the
  engine's sleep, the trainer's state back, then the trainer's phases, each after the other.
- split pools, on-policy (staleness 0): the rollout, then the trainer's phases, then the weight transfer (which holds
  both pools: the engine cannot generate while its weights change); the pools take turns.
- split or async pools with staleness k >= 1: the rollout (for step i + k) and the trainer's phases (step i) start
  together; the weight transfer starts when both are done; the iteration ends with it (in steady state every
  iteration is alike: T = max(rollout, trainer) + transfer).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.rl.memory import TRAINER_PHASES
from meshplan.rl.setups import Setup

ENGINE_SIDE = ("offload", "wake", "sync", "rollout", "sleep", "reload")  # the colocated switches around the rollout
LOADS = {"reference": "ref_load"}  # a pass and the weight load it needs first


@dataclass(frozen=True)
class Segment:
    pool: str  # all, rollout or train
    phase: str
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


def _trainer_order() -> list[str]:
    out = []
    for phase in TRAINER_PHASES:
        if phase in LOADS:
            out.append(LOADS[phase])
        out.append(phase)
    return out


def _chain(pool: str, names: list[str], phases: dict[str, float], start: float) -> list[Segment]:
    out, t = [], start
    for name in names:
        seconds = phases.get(name, 0.0)
        if seconds > 0:
            out.append(Segment(pool, name, t, t + seconds))
            t += seconds
    return out


def iteration(way: Setup, phases: dict[str, float], staleness: int) -> tuple[tuple[Segment, ...], float]:
    """The segments of one iteration and its time (module docstring)."""
    trainer = _trainer_order()
    if way.shared:
        segs = _chain("all", [*ENGINE_SIDE, *trainer], phases, 0.0)
        return tuple(segs), (segs[-1].end if segs else 0.0)
    sync = phases.get("sync", 0.0)
    if not (way.overlapped and staleness >= 1):
        roll = _chain("rollout", ["rollout"], phases, 0.0)
        turn = roll[-1].end if roll else 0.0
        train = _chain("train", trainer, phases, turn)
        end = train[-1].end if train else turn
        both = [Segment(p, "sync", end, end + sync) for p in ("train", "rollout")] if sync else []
        return tuple(roll + train + both), end + sync
    roll = _chain("rollout", ["rollout"], phases, 0.0)
    train = _chain("train", trainer, phases, 0.0)
    end = max(roll[-1].end if roll else 0.0, train[-1].end if train else 0.0)
    both = [Segment(p, "sync", end, end + sync) for p in ("train", "rollout")] if sync else []
    return tuple(roll + train + both), end + sync


def pool_busy(segments: tuple[Segment, ...], pool: str) -> float:
    """Seconds ``pool`` works in the iteration."""
    return sum(s.seconds for s in segments if s.pool == pool)
