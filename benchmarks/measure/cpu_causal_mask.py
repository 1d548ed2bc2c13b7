"""The host time of the causal attention mask that Megatron-DeepSpeed built on the CPU for every micro-batch from
a2a476e1 (2023-08-23, "DeepSpeed Ulysses Release") until af06d144 (2024-07-08, #411 "improve performance by keeping
attention_mask on device and run ops further on device"): megatron/utils.py get_ltor_masks_and_position_ids made
``torch.tril(torch.ones((b, s, s)))`` without a device (b = 1 unless --reset-attention-mask), compared it with 0.5
and only then moved it with ``.to(data.device)``. pretrain_gpt.py's get_batch calls it for every micro-batch, after
broadcast_data has read the batch's sizes back with ``.cpu()`` (megatron/core/tensor_parallel/data.py), a
synchronisation: the GPU has drained its queue and waits while the host builds the mask, so the time adds to each
micro-batch (meshplan's ``Stack.microbatch_host``, step/stages.loop_times). vTrain's runs used a Megatron-DeepSpeed of
that window (meshplan_validation/sources.py VTRAIN: 4822c87e, September 2023).

Replayed here as written, on one intra-op thread (torchrun sets OMP_NUM_THREADS=1 for every process unless the
environment says otherwise: torch/distributed/run.py), the least of ``--repeats`` timings for each sequence length.
The pageable host-to-device copy of the s x s boolean mask that follows (1 MiB at s = 1024) needs a GPU: not timed.

Run: python benchmarks/measure/cpu_causal_mask.py [--out data/measured/2026-11-28-cpu-causal-mask.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

SEQUENCES = (512, 1024, 2048)


def mask_seconds(torch, seq: int, repeats: int) -> float:
    """The least wall time of the CPU mask as get_ltor_masks_and_position_ids built it (module docstring)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        mask = torch.tril(torch.ones((1, seq, seq))).view(1, 1, seq, seq)
        mask = mask < 0.5
        best = min(best, time.perf_counter() - start)
    del mask
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    import torch  # noqa: PLC0415  (heavy: imported where used)

    torch.set_num_threads(1)
    seconds = {str(s): mask_seconds(torch, s, args.repeats) for s in SEQUENCES}
    record = {"what": "Megatron-DeepSpeed a2a476e1..af06d144 megatron/utils.py get_ltor_masks_and_position_ids: the "
                      "causal mask built on the CPU (ones, tril, < 0.5), one intra-op thread, least of the repeats",
              "made_by": "benchmarks/measure/cpu_causal_mask.py", "date": time.strftime("%Y-%m-%d"),
              "host": platform.processor() or platform.machine(), "torch": torch.__version__,
              "python": platform.python_version(), "repeats": args.repeats, "seconds_by_sequence": seconds,
              "ns_per_mask_element": {s: 1e9 * t / int(s) ** 2 for s, t in seconds.items()}}
    text = json.dumps(record, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    sys.stdout.write(text + "\n")


if __name__ == "__main__":
    main()
