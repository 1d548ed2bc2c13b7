"""An engine's scheduler as data: what it puts in an iteration and what it does when the KV cache runs out, one record
per scheduler read in the engine's own source (``presets/schedulers/<name>.toml``, each field beside the file and
version it follows). An engine preset takes the scheduler whose ``engines`` list names it and whose flags are its
prefill's (so an engine version, which picks its preset through presets/engine_versions.toml, picks its
scheduler); ``--scheduler`` picks another; an engine from a user's file takes the one its own fields describe
(``from_engine``).

- ``mixed``: decodes share an iteration with prompt tokens (vLLM V1, TensorRT-LLM's in-flight batching); else an
  iteration that carries prompt tokens runs no decodes (vLLM V0's default, SGLang, TurboMind v0.1: prefill first).
- ``chunked``: a prompt longer than the budget left is cut to fit; else it waits for an iteration it fits whole.
- ``admission``: ``on_demand`` (blocks for the tokens scheduled now, a ``watermark`` share kept free), ``reserve``
  (its prompt and whole output must fit beside every running request's: TensorRT-LLM's GUARANTEED_NO_EVICT) or
  ``new_token_ratio`` (SGLang's PrefillAdder: the running requests' remaining outputs counted at a ratio that decays
  each decode step and is reset by a retraction).
- ``preempt``: when the next decode does not fit, ``newest`` (vLLM: the last admitted gives back its blocks and is
  recomputed), ``retract`` (SGLang: the fewest output tokens, then the longest prompt, until ``retract_decode_steps``
  steps of the rest fit) or ``none`` (admission guarantees it never happens); ``resume``: the preempted request
  goes back to the ``head`` or the ``tail`` of the waiting queue.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cache
from typing import Any

from meshplan.errors import SpecError
from meshplan.fields import check_types, not_a_preset, unknown_field
from meshplan.files import PRESETS, preset_toml
from meshplan.serve.engine import Engine

ADMISSIONS = ("on_demand", "reserve", "new_token_ratio")
PREEMPTIONS = ("newest", "retract", "none")
RESUMES = ("head", "tail")


@dataclass(frozen=True, kw_only=True)
class Policy:
    """One engine's scheduler (module docstring)."""

    name: str
    source: str = ""
    engines: tuple[str, ...] = ()
    mixed: bool = True
    chunked: bool = True
    admission: str = "on_demand"
    watermark: float = 0.0  # share of the KV cache an admission leaves free (vLLM V0's BlockSpaceManager: 0.01)
    preempt: str = "newest"
    resume: str = "head"
    # each loop admits and prefills, then runs one decode step of the whole batch (TurboMind's ContextDecode then
    # Generate): a prefill iteration is always followed by a decode one
    alternate: bool = False
    budget: int = 0  # tokens per iteration (0: the engine's max_batched_tokens)
    max_prefill_tokens: int = 0  # prompt tokens of a prefill iteration (SGLang's max_prefill_tokens; 0: no limit)
    init_new_token_ratio: float = 0.7
    min_new_token_ratio_factor: float = 0.14
    new_token_ratio_decay_steps: float = 600.0
    clip_max_new_tokens: int = 4096
    retract_decode_steps: int = 20

    def __post_init__(self) -> None:
        where = f"scheduler {self.name}: "
        check_types(self, where)
        for name, allowed in (("admission", ADMISSIONS), ("preempt", PREEMPTIONS), ("resume", RESUMES)):
            if getattr(self, name) not in allowed:
                raise SpecError(f"{where}{name}={getattr(self, name)!r} must be one of {', '.join(allowed)}")
        if not 0 <= self.watermark < 1:
            raise SpecError(f"{where}watermark={self.watermark} must be from 0 to below 1 (a share of the KV cache)")
        if self.budget < 0 or self.max_prefill_tokens < 0 or self.new_token_ratio_decay_steps <= 0:
            raise SpecError(f"{where}budget, max_prefill_tokens must be at least 0 and new_token_ratio_decay_steps "
                            "above 0")
        if (self.admission == "reserve") != (self.preempt == "none"):
            raise SpecError(f"{where}admission='reserve' never preempts (preempt='none'), and only it")

    @property
    def min_new_token_ratio(self) -> float:
        return min(self.init_new_token_ratio * self.min_new_token_ratio_factor, 1.0)

    @property
    def new_token_ratio_decay(self) -> float:
        """What the ratio loses per decode step (SGLang's new_token_ratio_decay)."""
        return (self.init_new_token_ratio - self.min_new_token_ratio) / self.new_token_ratio_decay_steps


def _from_dict(data: dict[str, Any], where: str) -> Policy:
    known = {f.name for f in fields(Policy)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise unknown_field(where, unknown[0], known, "Policy's (meshplan/serve/load/policy.py)")
    if isinstance(data.get("engines"), list):
        data = {**data, "engines": tuple(data["engines"])}
    for name in ("new_token_ratio_decay_steps", "init_new_token_ratio", "min_new_token_ratio_factor", "watermark"):
        if isinstance(data.get(name), int) and not isinstance(data.get(name), bool):
            data = {**data, name: float(data[name])}
    return Policy(**data)


@cache
def policies() -> dict[str, Policy]:
    """Every scheduler preset by name."""
    root = PRESETS / "schedulers"  # (as plain files: importlib.resources's readers are start-up, files.PRESETS)
    out = {}
    for path in sorted((p for p in root.iterdir() if p.name.endswith(".toml")), key=lambda p: p.name):
        policy = _from_dict(preset_toml(path.read_text(encoding="utf-8"), f"scheduler preset {path.name}"),
                            f"scheduler preset {path.name}")
        out[policy.name] = policy
    return out


def from_engine(engine: Engine) -> Policy:
    """The scheduler an engine's own fields describe (an engine from a user's file): chunked prefill beside the
    decodes, whole prompts beside them, or whole prompts first (Engine.prefill, the steady state's own reading:
    metrics.py); a full reservation (or queueing admission) that never preempts, or blocks on demand with the newest
    preempted."""
    reserve = engine.mode("kv_reservation").whole or engine.mode("kv_overflow").queues
    prefill = engine.mode("prefill")
    return Policy(name=f"{engine.name} (its fields)", source=engine.source, mixed=prefill.mixed,
                  chunked=prefill.chunked,
                  admission="reserve" if reserve else "on_demand", preempt="none" if reserve else "newest")


def policy_for(engine: Engine, name: str | None = None) -> Policy:
    """The scheduler named ``name`` (``--scheduler``), else among those whose ``engines`` names the engine preset the
    one whose ``mixed`` and ``chunked`` are the engine's prefill (Engine.prefill, which the steady state reads too:
    TensorRT-LLM's chunked context on or off), else the first of them, else the one its fields describe (module
    docstring)."""
    table = policies()
    if name is not None:
        if name not in table:
            raise not_a_preset("scheduler", name, sorted(table), "a scheduler preset")
        return table[name]
    named = [p for p in table.values() if engine.name in p.engines]
    prefill = engine.mode("prefill")
    same = [p for p in named if (p.mixed, p.chunked) == (prefill.mixed, prefill.chunked)]
    return (same or named or [from_engine(engine)])[0]
