"""RLJob: what one iteration of reinforcement-learning post-training asks for, apart from how it is placed (plan.py).

Per iteration, ``prompts`` prompts of ``input_len`` tokens, each sampled ``samples_per_prompt`` times (verl's
``data.train_batch_size`` and ``actor_rollout_ref.rollout.n``; OpenRLHF's ``--rollout_batch_size`` and
``--n_samples_per_prompt``; NeMo-RL's ``num_prompts_per_step`` and ``num_generations_per_prompt``), responses of at
most ``output_len`` tokens (verl's ``data.max_response_length``) whose lengths follow ``lengths`` (lengths.py).
The trainer then takes the batch in ``mini_batches`` optimizer steps per epoch for ``epochs`` epochs (verl's
``ppo_mini_batch_size`` and ``ppo_epochs``). ``oversample`` rollout batches are drawn per trained batch (DAPO's
dynamic sampling). ``staleness`` is how many steps a split or asynchronous rollout may run ahead of the weights it
samples with (0: on-policy, the pools take turns).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from meshplan import ranges
from meshplan.errors import SpecError
from meshplan.fields import check_types
from meshplan.rl.algorithms import RLAlgorithm, algorithm
from meshplan.specs.model import ModelSpec

_LENGTH_KINDS = ("fixed", "uniform", "lognormal", "empirical")


@dataclass(frozen=True, kw_only=True)
class RLJob:
    """One iteration's work (module docstring)."""

    prompts: int
    input_len: int
    output_len: int  # the longest response (max_response_length)
    samples_per_prompt: int = 1
    lengths: str = "fixed"  # _LENGTH_KINDS (lengths.py)
    mean_output: float = 0.0  # mean response tokens; 0: output_len (fixed lengths)
    length_spread: float = 0.0  # the uniform range ratio or the log-normal's sigma; 0: the kind's default (lengths.py)
    lengths_file: str = ""  # empirical: a CSV / JSONL file of output_len values
    algorithm: str = "grpo"  # algorithms.RL_ALGORITHMS
    mini_batches: int = 1
    epochs: int = 1
    reference: bool | None = None  # None: as the algorithm
    critic: bool | None = None  # None: as the algorithm
    reward_model: ModelSpec | None = None  # a model-based reward scored by a forward pass; None: a rule (no GPU)
    rollout_logprobs: bool = False  # take the engine's log-probabilities (no recompute by the trainer)
    oversample: float = 1.0
    staleness: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        check_types(self, "rl job: ")
        ranges.check_spec(self, "rl job: ")
        algo = algorithm(self.algorithm)
        if self.lengths not in _LENGTH_KINDS:
            raise SpecError(f"rl job: lengths={self.lengths!r} must be one of {', '.join(_LENGTH_KINDS)}")
        if self.mean_output > self.output_len:
            raise SpecError(f"rl job: mean_output={self.mean_output:g} must be at most output_len={self.output_len:,} "
                            "(the longest response)")
        if self.lengths in ("uniform", "lognormal") and not self.mean_output:
            raise SpecError(f"rl job: lengths={self.lengths} needs mean_output (the mean response tokens)")
        if self.lengths == "empirical" and not self.lengths_file:
            raise SpecError("rl job: lengths=empirical needs lengths_file (a CSV / JSONL file of output_len)")
        if algo.group and self.samples_per_prompt < 2:
            raise SpecError(f"rl job: algorithm={algo.name} takes a group baseline: samples_per_prompt="
                            f"{self.samples_per_prompt} must be at least 2")
        if self.sequences % self.mini_batches:
            raise SpecError(f"rl job: mini_batches={self.mini_batches} must divide the batch's prompts x samples = "
                            f"{self.sequences:,} sequences")
        if self.reward_model is not None and not isinstance(self.reward_model, ModelSpec):
            raise SpecError("rl job: reward_model must be a ModelSpec (or None: a rule-based reward)")

    @property
    def algo(self) -> RLAlgorithm:
        return algorithm(self.algorithm)

    @property
    def sequences(self) -> int:
        """Rollouts per iteration: prompts × samples per prompt (the trained batch)."""
        return self.prompts * self.samples_per_prompt

    @property
    def generated(self) -> int:
        """Rollouts generated per iteration: the trained batch × oversample, whole prompt groups."""
        return math.ceil(self.prompts * self.oversample) * self.samples_per_prompt

    @property
    def mini_batch(self) -> int:
        """Sequences per optimizer step (verl's ppo_mini_batch_size × n)."""
        return self.sequences // self.mini_batches

    @property
    def updates(self) -> int:
        """Optimizer steps per iteration: epochs × mini-batches."""
        return self.epochs * self.mini_batches

    @property
    def uses_reference(self) -> bool:
        return self.algo.reference if self.reference is None else self.reference

    @property
    def uses_critic(self) -> bool:
        return self.algo.critic if self.critic is None else self.critic

    @property
    def mean_response(self) -> float:
        return self.mean_output or float(self.output_len)

    @property
    def train_seq(self) -> int:
        """The trainer's sequence: prompt and mean response, packed without padding (verl's use_remove_padding,
        NeMo-RL's sequence packing, OpenRLHF's --packing_samples), so a micro-batch's tokens are its sequences'
        mean length each (the attention's quadratic part is taken at that mean length: a stated simplification)."""
        return self.input_len + max(1, round(self.mean_response))

    def describe(self) -> str:
        lengths = (f"{self.output_len:,}" if self.lengths == "fixed" else
                   f"mean {self.mean_response:,.0f}, at most {self.output_len:,} ({self.lengths})")
        return (f"{self.algorithm}: {self.prompts:,} prompts x {self.samples_per_prompt} samples, {self.input_len:,} "
                f"in / {lengths} out")
