"""Every feasible plan of a search as CSV (``meshplan plan --all -o plans.csv``): one row per plan, fastest first.

The rows are the search's own columns (search/explore.py, ``Explore`` with ``ALL_FEASIBLE``: every size combination
timed under every setting, the plans that fit kept), written column by column with NumPy, so that a space of a million
feasible plans takes seconds. The step times are the search's float32 sums (scoring.grid_times: estimate()'s step on
arrays; they agree with estimate()'s float64 to about 1e-6), its re-estimated top plans the exception.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from meshplan.files import write_text
from meshplan.search.explore import LAYOUTS, SCHEDULES, SIZES

COLUMNS = ("gpus", "step_time_s", "tokens_per_s", "peak_memory_bytes", *SIZES, "zero", "recompute",
           "recompute_layers", "sequence_parallel", "schedule", "tensor_layout", "offload_optimizer",
           "offload_activations", "offload_layers", "placement")


def _plan_columns(result) -> dict[str, np.ndarray]:  # result: a search.SearchResult run with ALL_FEASIBLE
    """The feasible plans of ``result`` as columns (``COLUMNS``), fastest first (ties: less memory)."""
    cols = result.explored.columns if result.explored is not None else {}
    if not len(cols.get("time", ())):
        return {name: np.empty(0, dtype=object) for name in COLUMNS}
    order = np.lexsort((cols["memory"], cols["time"]))
    c = {k: v[order] for k, v in cols.items()}
    grid, space, model = result.explored.grid, result.space, result.model
    time = c["time"].astype(np.float64)
    per_stage = -(-model.num_layers // c["pp"])  # a count that covers a stage is "all of them": 0 (evaluate._decode)
    recompute = np.array(grid[0])[c["recompute"]]
    offload_act = np.array(grid[3])[c["offload_activations"]]
    out = {"gpus": np.full(len(time), result.cluster.num_gpus), "step_time_s": time,
           "tokens_per_s": space.global_batch * model.seq_length / time,
           "peak_memory_bytes": c["memory"].astype(np.float64)}
    out |= {name: c[name] for name in SIZES}
    out |= {"zero": np.array(grid[1])[c["zero"]], "recompute": recompute,
            "recompute_layers": np.where((recompute == "full") & (space.recompute_layers < per_stage),
                                         space.recompute_layers, 0),
            "sequence_parallel": c["sequence_parallel"], "schedule": np.array(SCHEDULES)[c["schedule"]],
            "tensor_layout": np.array(LAYOUTS)[c["layout"]],
            "offload_optimizer": np.array(grid[2])[c["offload_optimizer"]], "offload_activations": offload_act,
            "offload_layers": np.where(offload_act & (space.offload_layers < per_stage), space.offload_layers, 0),
            "placement": np.array([f'"{",".join(p)}"' for p in result.explored.placements])[c["placement"]]}
    return out


def _text(values: np.ndarray) -> np.ndarray:
    """A column as strings: numbers in full precision (repr), booleans as true / false."""
    if values.dtype == bool:
        return np.where(values, "true", "false")
    if values.dtype.kind == "f":
        return np.array([repr(float(v)) for v in values.tolist()], dtype=object)
    return values.astype(str)


def csv_text(results) -> str:
    """The feasible plans of every result (one per GPU count), one CSV with a header row."""
    out = io.StringIO()
    out.write(",".join(COLUMNS) + "\n")
    for result in results:
        cols = _plan_columns(result)
        if len(cols["gpus"]):
            rows = zip(*(_text(np.asarray(cols[name])) for name in COLUMNS), strict=True)
            out.write("\n".join(map(",".join, rows)) + "\n")
    return out.getvalue()


def write_plans_csv(results, path: str | Path) -> Path:
    return write_text(path, csv_text(results), "output")
