"""The host time of Megatron-LM's CI training loop per step outside the model and the optimizer: its logging at
--log-interval 1 with --log-timers-to-tensorboard (the validation profile "Megatron-LM CI 2024",
``Stack.iteration_host``), replayed on this host with the same tensorboard writer.

What is replayed is counted in Megatron-LM's own code (NVIDIA/Megatron-LM 6aad2116, megatron/training.py
training_log; the flags of tests/functional_tests/test_scripts/gpt3/pretrain_gpt3_distributed_test.sh): each step
``timers.write`` adds one scalar per timer the run has created (of the 24 names of ``timers_to_log``, the 20 a
pipelined run without the distributed optimizer creates at --timing-log-level 2: forward-backward, forward-compute,
backward-compute, batch-generator, the 1F1B schedule's six p2p timers, all-grads-sync, layernorm- and
embedding-grads-all-reduce, the six optimizer-* timers and optimizer), then
``training_log`` adds learning-rate, lm loss, loss-scale, grad-norm, num-zeros and params-norm, each also "vs
samples" (the flags on by default or set by the script), and iteration-time, and formats and prints the log line
and the timers' line. The timers' all-gather and the .item() reads are synchronisations on a GPU, not Python: not
replayed. Its per-micro-batch work (the timers' torch.cuda.synchronize at each start and stop, megatron/timers.py;
the pipeline sends' synchronise; the batch's fetch, broadcast and attention-mask copy; the loss's NaN check and
data-parallel all-reduce) needs a GPU to time: ``Stack.microbatch_host`` of that profile is fitted instead
(meshplan_validation/sources.py, data/measured/2026-11-26-megatron-ci-loop.md).

Run: python benchmarks/measure/megatron_ci_loop.py   (needs the tensorboard package: pip install tensorboard)
"""

from __future__ import annotations

import os
import tempfile
import time

TIMERS_PIPELINED = 20  # timers a pipelined run (pp > 1, no distributed optimizer) creates at --timing-log-level 2
SCALARS = 2 * 6 + 1  # learning-rate, lm loss, loss-scale, grad-norm, num-zeros, params-norm (+ "vs samples"), time


def one_step(writer, iteration: int, loss, sink) -> None:
    """The tensorboard writes and log lines of one step of training_log (the lines to ``sink``, flushed as
    Megatron's print_rank_last flushes)."""
    for k in range(TIMERS_PIPELINED):
        writer.add_scalar(f"timer-{k}-time", 0.001 * k, iteration)
    for k in range(SCALARS - 1):
        writer.add_scalar(f"scalar-{k}", float(k), iteration)
    writer.add_scalar("iteration-time", 0.05, iteration)
    line = f" iteration {iteration:8d}/{50:8d} | consumed samples: {32 * iteration:12d} |"
    line += f" lm loss: {float(loss):.6E} | loss scale: {65536.0:.1f} | grad norm: {1.5:.3f} |"
    timers = " | ".join(f"timer-{k}: {0.1 * k:.2f}" for k in range(TIMERS_PIPELINED))
    print(line, file=sink, flush=True)
    print("(min, max) time across ranks (ms): " + timers, file=sink, flush=True)


def measure(steps: int = 300) -> float:
    """Seconds per step of the replayed logging on this host (median of 5 runs of ``steps``)."""
    import torch
    from torch.utils.tensorboard import SummaryWriter

    writer, loss, runs = SummaryWriter(tempfile.mkdtemp()), torch.tensor(2.5), []
    with open(os.devnull, "w") as sink:
        for it in range(50):
            one_step(writer, it, loss, sink)
        for _ in range(5):
            start = time.perf_counter()
            for it in range(steps):
                one_step(writer, it, loss, sink)
            runs.append((time.perf_counter() - start) / steps)
    writer.close()
    return sorted(runs)[2]


def main() -> None:
    seconds = measure()
    print(f"Megatron-LM CI training_log per step: {TIMERS_PIPELINED + SCALARS} tensorboard scalars and two log "
          f"lines: {seconds * 1e3:.2f} ms on this host (the profile's iteration_host: 1.0 ms)")


if __name__ == "__main__":
    main()
