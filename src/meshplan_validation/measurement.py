"""What a published run measured and which of its quantities the prediction is compared on: a time or a throughput
where given (exact conversions); otherwise TFLOP/s or MFU, on the FLOP basis the source used (flops.flops_basis).
"""

from __future__ import annotations

import math
from typing import Any

from meshplan_validation.flops import flops_basis
from meshplan_validation.skip import Skip

# the schema's measured quantities, in the order a record's are compared
METRICS = ("iteration_time_s", "tokens_per_s_per_gpu", "tokens_per_s_total", "model_tflops_per_gpu",
           "tflops_per_gpu", "mfu_pct", "hfu_pct", "pct_of_peak")
PERCENT_OF_PEAK = ("mfu_pct", "hfu_pct", "pct_of_peak")  # of the dense 16-bit peak
FLOP_METRICS = ("model_tflops_per_gpu", "tflops_per_gpu", *PERCENT_OF_PEAK)
UNKNOWN_BASIS_NOTE = ("FLOP formula of the measured TFLOP/s or MFU not stated: model FLOPs (Megatron-LM's formula, "
                      "no recompute) assumed")


def pick_metric(record: dict[str, Any]) -> tuple[str, float, str]:
    """The measured quantity to compare, in METRICS order: a time or a throughput where given, else TFLOP/s or MFU
    with the source's FLOP formula (``flops_basis``); a FLOP figure whose formula the record does not name is
    taken as model FLOPs, the common convention, when nothing else was measured (case.map_run says so)."""
    measured = record.get("measured") or {}
    values = {m: float(measured[m]) for m in METRICS  # 0, negative, subnormal or infinite: no measurement
              if isinstance(measured.get(m), (int, float)) and 1e-9 < measured[m] < math.inf}
    basis = flops_basis(record)
    for metric, value in values.items():
        if metric not in FLOP_METRICS:
            return metric, value, ""
        if basis != "unknown":
            return metric, value, basis
    for metric, value in values.items():
        return metric, value, "model"
    unusable = [f"{m}={measured[m]!r}" for m in METRICS if measured.get(m) is not None]  # 0, negative, ...
    others = sorted(k for k, v in measured.items() if v is not None and k not in METRICS)
    said = ": " + ", ".join(f"measured.{u}" for u in unusable) + " not a positive number" if unusable else ""
    only = f" (only {', '.join(others)})" if others else ""
    raise Skip("no comparable measurement" + (said + only if said or only else ": all values null"))
