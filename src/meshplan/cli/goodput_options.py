"""``--mtbf``, ``--checkpoint-bandwidth`` and ``--restart-time``: the failure accounting of derived/goodput.py, for
``plan`` (days to train, ranking across GPU counts) and ``estimate``."""

from __future__ import annotations

from typing import Any

import click

from meshplan.derived.goodput import LLAMA3_MTBF_GPU_HOURS, LLAMA3_STORAGE_BYTES_S, RECOVERIES, RESTART_S, Reliability
from meshplan.errors import SpecError

reliability_options = [
    click.option("--mtbf", "mtbf", default=None,
                 help="GPU-hours per interruption of the job, per GPU ('llama3': "
                      f"{LLAMA3_MTBF_GPU_HOURS:,.0f}, Llama 3's 419 interruptions in 54 days on 16,384 GPUs); "
                      "prices checkpoints, restarts and lost work (goodput)"),
    click.option("--checkpoint-bandwidth", "checkpoint_bandwidth", type=float, default=None,
                 help=f"with --mtbf: GB/s the job's ranks write checkpoints at, together (default "
                      f"{LLAMA3_STORAGE_BYTES_S / 1e9:,.0f}: Llama 3's storage, sustained)"),
    click.option("--restart-time", "restart_time", type=float, default=None,
                 help=f"with --mtbf: seconds to restart after an interruption, before reading the checkpoint back "
                      f"(default {RESTART_S:.0f}, an assumption)"),
    click.option("--recovery", "recovery", type=click.Choice(RECOVERIES), default=None,
                 help="with --mtbf: the whole job restarts from its last checkpoint (restart, the default), or only "
                      "the failed data-parallel replica drops out and heals from a peer while the others train on "
                      "(replica: TorchFT; plans without ZeRO sharding; --framework any); plan ranks by the expected "
                      "time either way"),
]


def reliability_of(options: dict[str, Any]) -> Reliability | None:
    """The Reliability the options ask for (they are taken out of ``options``), None without --mtbf."""
    mtbf, bandwidth, restart, recovery = (options.pop(k) for k in ("mtbf", "checkpoint_bandwidth", "restart_time",
                                                                   "recovery"))
    if mtbf is None:
        if bandwidth is not None or restart is not None or recovery is not None:
            given = "--checkpoint-bandwidth" if bandwidth is not None else (
                "--restart-time" if restart is not None else "--recovery")
            raise SpecError(f"{given} prices failures: give --mtbf too (GPU-hours per interruption, or 'llama3')")
        return None
    if mtbf == "llama3":
        hours = LLAMA3_MTBF_GPU_HOURS
    else:
        try:
            hours = float(mtbf)
        except ValueError:
            raise SpecError(f"mtbf={mtbf!r} must be GPU-hours per interruption (a number) or 'llama3'") from None
    if bandwidth is not None and not 1e-3 <= bandwidth <= 1e6:  # also NaN; Reliability's bounds, in GB/s
        raise SpecError(f"checkpoint-bandwidth={bandwidth} must be GB/s from 0.001 to 1,000,000")
    return Reliability(mtbf_gpu_hours=hours,
                       checkpoint_bandwidth=LLAMA3_STORAGE_BYTES_S if bandwidth is None else bandwidth * 1e9,
                       restart_s=RESTART_S if restart is None else restart, recovery=recovery or "restart")
