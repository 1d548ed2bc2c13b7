"""The RL algorithms as a registry of records: which model calls an iteration makes beside the rollout and the policy
update. Callers ask a record's fields, never its name (DESIGN.md example 16).

- ``ppo``: proximal policy optimisation with a learned value function (Schulman et al. 2017, "Proximal Policy
  Optimization Algorithms", §5, GAE advantages) and a KL penalty to the reference policy (Ouyang et al. 2022,
  "Training language models to follow instructions with human feedback", §3.5, eq. 2): a critic forward for the
  values, a critic update, a reference forward (verl ``algorithm.adv_estimator=gae``; OpenRLHF
  ``--advantage_estimator gae``).
- ``grpo``: group relative policy optimisation (Shao et al. 2024, "DeepSeekMath", §4.1): the group's mean reward is
  the baseline (no critic), a KL term to the reference in the loss (eq. 3), groups of several samples per prompt.
- ``dapo``: decoupled clip and dynamic sampling (Yu et al. 2025, "DAPO", §3.2 and §3.4): GRPO without the KL term
  ("we exclude the KL term", §2.3), so no reference forward; dynamic sampling draws more rollout batches until the
  trained batch holds groups whose rewards differ (``RLJob.oversample``).
- ``rloo``: REINFORCE leave-one-out (Ahmadian et al. 2024, "Back to Basics", §3.3): the other samples' mean as the
  baseline, the KL in the reward (a reference forward).
- ``reinforce++``: REINFORCE with PPO's clipping and a batch-normalised advantage (Hu 2025, "REINFORCE++", §3), a KL
  to the reference; one sample per prompt allowed.

Every algorithm recomputes the behaviour policy's log-probabilities with the trainer before the update (verl's
``compute_log_prob``, NeMo-RL's ``prev_logprobs``, OpenRLHF's ``make_experience``), unless the job takes the
engine's own (``RLJob.rollout_logprobs``).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.errors import SpecError


@dataclass(frozen=True)
class RLAlgorithm:
    """What one iteration of an algorithm runs beside the rollout and the policy update (module docstring)."""

    name: str
    critic: bool  # a value model: its forward for the values and its own update
    reference: bool  # a frozen reference policy's log-probabilities for a KL term
    group: bool  # a group baseline: two or more samples per prompt
    dynamic_sampling: bool  # rollout batches drawn until the trained batch is full (RLJob.oversample)
    source: str


RL_ALGORITHMS: dict[str, RLAlgorithm] = {a.name: a for a in (
    RLAlgorithm("ppo", critic=True, reference=True, group=False, dynamic_sampling=False,
              source="Schulman et al. 2017 §5; Ouyang et al. 2022 §3.5 eq. 2"),
    RLAlgorithm("grpo", critic=False, reference=True, group=True, dynamic_sampling=False,
              source="Shao et al. 2024 (DeepSeekMath) §4.1 eq. 3"),
    RLAlgorithm("dapo", critic=False, reference=False, group=True, dynamic_sampling=True,
              source="Yu et al. 2025 (DAPO) §2.3, §3.2, §3.4"),
    RLAlgorithm("rloo", critic=False, reference=True, group=True, dynamic_sampling=False,
              source="Ahmadian et al. 2024 (Back to Basics) §3.3"),
    RLAlgorithm("reinforce++", critic=False, reference=True, group=False, dynamic_sampling=False,
              source="Hu 2025 (REINFORCE++) §3"),
)}


def algorithm(name: str) -> RLAlgorithm:
    """The record of ``name``; an unknown one is one line naming the choices."""
    found = RL_ALGORITHMS.get(name)
    if found is None:
        raise SpecError(f"algorithm={name!r} must be one of {', '.join(RL_ALGORITHMS)}")
    return found
