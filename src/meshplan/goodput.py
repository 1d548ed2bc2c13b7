"""Goodput under failures: a training run on N GPUs is interrupted at a rate that grows with N, loses the work since
its last checkpoint at each interruption, pays a restart, and pays each checkpoint it writes. The expected wall time
per unit of useful time, at the best checkpoint interval, is what a plan's step time is multiplied by.

- Failures: independent, exponential, one per ``mtbf_gpu_hours`` per GPU, so the job's mean time between
  interruptions is M = mtbf_gpu / N (a synchronous job stops when any of its GPUs does). Llama 3's 405B run (Dubey et
  al. 2024, "The Llama 3 Herd of Models", §3.3.4 and Table 5): 419 unexpected interruptions in a 54-day snapshot on
  16,384 H100s, so 16,384 × 54 × 24 / 419 = 50,679 GPU-hours per interruption (``LLAMA3_MTBF_GPU_HOURS``), M = 3.09 h
  for that job; the interruptions count every cause (GPU, HBM, network, host), not GPUs alone.
- A checkpoint holds the training state, weights and optimizer state (the trainable parameters' master copy and
  moments: memory.OPTIMIZER_STATE) of the whole model, written by all ranks at once at the storage's aggregate
  bandwidth: δ = bytes / bandwidth. Llama 3's Tectonic storage sustains 2 TB/s (7 TB/s peak; §3.3.1).
- A restart costs ``restart_s`` (rescheduling, process start, communicator set-up: a stated assumption, 10 min by
  default) plus reading the checkpoint back at the same bandwidth.
- Interval and expected time: Daly 2006 ("A higher order estimate of the optimum checkpoint interval for restart
  dumps", Future Generation Computer Systems 22(3): 303-312), eq. 20 for the optimum τ (δ < 2M; else τ = M) and
  eq. 13 for the expected wall time of T_s of useful work, T_w = M·e^{R/M}·(e^{(τ+δ)/M} − 1)·T_s / τ. Young 1974's
  τ = sqrt(2δM) is its first term. Goodput = T_s / T_w.

Llama 3 405B on 16,384 H100s at these figures: 5.7 TB a checkpoint, δ = 2.8 s, τ ≈ 4.2 min, goodput 92.6 %, against
the paper's "higher than 90 %" effective training time (tests/test_goodput.py shows the arithmetic).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from meshplan.errors import SpecError
from meshplan.memory import OPTIMIZER_STATE, WEIGHT_BYTES
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan

LLAMA3_MTBF_GPU_HOURS = 16_384 * 54 * 24 / 419  # GPU-hours per unexpected interruption (module docstring)
LLAMA3_STORAGE_BYTES_S = 2e12  # Tectonic's sustained throughput for Llama 3's checkpoints (module docstring)
RESTART_S = 600.0  # an assumption, said wherever it is used: rescheduling, start-up, communicators


@dataclass(frozen=True)
class Reliability:
    """How often a GPU interrupts the job and what a checkpoint and a restart cost."""

    mtbf_gpu_hours: float = LLAMA3_MTBF_GPU_HOURS
    checkpoint_bandwidth: float = LLAMA3_STORAGE_BYTES_S  # bytes/s, aggregate over the job's ranks
    restart_s: float = RESTART_S

    def __post_init__(self) -> None:
        for name, low, high in (("mtbf_gpu_hours", 1.0, 1e9), ("checkpoint_bandwidth", 1e6, 1e15),
                                ("restart_s", 0.0, 1e6)):
            value = getattr(self, name)
            if not low <= value <= high:  # also refuses NaN
                raise SpecError(f"{name}={value!r} must be a number from {low:g} to {high:g}")


@dataclass(frozen=True)
class Goodput:
    """One job's failure accounting (seconds, bytes); ``factor`` multiplies its step time."""

    job_mtbf_s: float
    checkpoint_bytes: float
    checkpoint_s: float
    restart_s: float  # the restart and the checkpoint read back
    interval_s: float  # useful work between checkpoints (Daly's τ)
    factor: float  # expected wall time / useful time, ≥ 1

    @property
    def goodput(self) -> float:
        return 1.0 / self.factor

    @property
    def stalls(self) -> bool:
        """Whether the job makes no progress: interrupted so often (against its restart and checkpoint times) that
        its expected wall time per useful second overflows (wall_factor)."""
        return math.isinf(self.factor)

    def as_dict(self) -> dict[str, float | None]:
        """The figures as JSON holds them: a stalled job's factor is null (JSON has no infinity)."""
        return {"job_mtbf_s": self.job_mtbf_s, "checkpoint_bytes": self.checkpoint_bytes,
                "checkpoint_s": self.checkpoint_s, "restart_s": self.restart_s, "interval_s": self.interval_s,
                "factor": None if self.stalls else self.factor, "goodput": self.goodput}


def checkpoint_bytes(model: ModelSpec, plan: Plan) -> float:
    """The training state of the whole model: every weight (WEIGHT_BYTES) and the optimizer state of the trainable
    ones; under LoRA the adapters and their state only (the frozen base is not saved again, as PEFT saves)."""
    if plan.finetune == "lora":
        from meshplan.cost.params import adapter_params

        # adapter_params is per layer on one GPU (split over tp·tp2): the whole model's
        adapters = adapter_params(model, plan) * model.num_layers * plan.tp * plan.tp2
        return adapters * (WEIGHT_BYTES + OPTIMIZER_STATE[plan.optimizer].state)
    return model.params() * (WEIGHT_BYTES + OPTIMIZER_STATE[plan.optimizer].state)


def optimum_interval(delta: float, mtbf: float) -> float:
    """Daly 2006 eq. 20: τ = sqrt(2δM)·[1 + (1/3)·sqrt(δ/2M) + (1/9)·(δ/2M)] − δ for δ < 2M, else M."""
    if delta >= 2 * mtbf:
        return mtbf
    x = delta / (2 * mtbf)
    return math.sqrt(2 * delta * mtbf) * (1 + math.sqrt(x) / 3 + x / 9) - delta


# the largest factor a float holds: beyond it a job expects to spend more than e^709 times its useful time
_LOG_MAX = math.log(sys.float_info.max)


def wall_factor(interval: float, delta: float, restart: float, mtbf: float) -> float:
    """Daly 2006 eq. 13 per unit of useful work: M·e^{R/M}·(e^{(τ+δ)/M} − 1) / τ, summed in logarithms so that no
    MTBF overflows it: ln M + R/M + ln(e^x − 1) − ln τ with x = (τ+δ)/M, ln(e^x − 1) = x + ln(1 − e^{−x}) for large
    x. A job interrupted far more often than it can restart makes no progress: its factor is infinite (``stalls``)."""
    x = (interval + delta) / mtbf
    log_expm1 = math.log(math.expm1(x)) if x < 30 else x + math.log1p(-math.exp(-x))
    log_factor = math.log(mtbf) + restart / mtbf + log_expm1 - math.log(interval)
    return math.exp(log_factor) if log_factor < _LOG_MAX else math.inf


def goodput(model: ModelSpec, plan: Plan, gpus: int, rel: Reliability) -> Goodput:
    """The failure accounting of ``plan`` on ``gpus`` GPUs (module docstring)."""
    mtbf = rel.mtbf_gpu_hours * 3600 / gpus
    size = checkpoint_bytes(model, plan)
    delta = size / rel.checkpoint_bandwidth
    restart = rel.restart_s + delta  # the checkpoint is read back at the bandwidth it was written at
    tau = optimum_interval(delta, mtbf)
    return Goodput(job_mtbf_s=mtbf, checkpoint_bytes=size, checkpoint_s=delta, restart_s=restart, interval_s=tau,
                   factor=wall_factor(tau, delta, restart, mtbf))
