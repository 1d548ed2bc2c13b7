"""Runs torchtitan 0.2.2's own entry point (torchtitan/train.py main, its Trainer) on CPU processes, for
tests/test_configs_train_torchtitan.py:
``python -m torch.distributed.run ... tests/torchtitan_cpu_train.py --job.config_file job.toml [overrides]``.

torchtitan 0.2.2 does not run on a machine without an accelerator as shipped, for two reasons this file works around
before it imports torchtitan (nothing else of torchtitan changes):

- tools/utils.py ``get_device_info`` takes ``torch._utils._get_available_device_type() or "cuda"``: with no accelerator
  that is None, so "cuda", and Trainer.__init__ calls ``torch.cuda.set_device``. Here the available type is "cpu"
  (then torchtitan's process groups are gloo: distributed/utils.py ``_get_distributed_backend``).
- components/metrics.py's DeviceMemoryMonitor asks the device module for ``get_device_name``,
  ``get_device_properties(...).total_memory``, ``memory_stats``, ``reset_peak_memory_stats`` and ``empty_cache``, and
  distributed/utils.py ``set_pg_timeouts`` for ``current_device()`` as an index: torch.cpu has none of these (or a
  string), so the "cpu" device module here is torch.cpu with them added (a name, 16 GiB, no memory statistics).
"""

from __future__ import annotations

import types

import torch
import torch._utils

cpu = types.ModuleType("torchtitan_cpu_device")
cpu.__dict__.update({k: getattr(torch.cpu, k) for k in dir(torch.cpu) if not k.startswith("__")})
cpu.__dict__.update(
    get_device_name=lambda *args: "cpu", get_device_properties=lambda *args: types.SimpleNamespace(total_memory=2**34),
    reset_peak_memory_stats=lambda *args: None, empty_cache=lambda *args: None, current_device=lambda: 0,
    memory_stats=lambda *args: {"active_bytes.all.peak": 0, "reserved_bytes.all.peak": 0, "num_alloc_retries": 0,
                                "num_ooms": 0})
_device_module = torch._utils._get_device_module
torch._utils._get_available_device_type = lambda: "cpu"
torch._utils._get_device_module = lambda kind="cuda": cpu if kind == "cpu" else _device_module(kind)

if __name__ == "__main__":
    # torchtitan's own entry point (train.py main): it parses sys.argv, trains, closes the trainer and destroys the
    # process group. The interpreter's teardown after it can still abort in the destructor of a thread left joinable
    # (gloo's, the data loader's: "terminate called without an active exception", 1 run in about 8 here, after
    # "Process group destroyed"), so once main has returned the process flushes its output and ends without it.
    import logging
    import os
    import sys

    from torchtitan.train import Trainer, main

    main(Trainer)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
