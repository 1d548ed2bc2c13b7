"""Per-op profiles as JSON lines: what check-step predicted and measured, op by op, for the learned model
(learned.py) and the zoo's document (benchmarks/docs/measured.py). No torch here.

One file per run of the zoo (``data/measured/<date>-<machine>.jsonl.gz``, gzip: ten models make 10,000 lines);
each line is a record:

    {"record": "step", "model", "machine", "date", "params", "ops", "kernels", "predicted_s", "measured_s",
     "steps_s", "wall_s", "host_cpu_s", "kernels_s", "host_s", "module_calls", "predicted_peak_bytes",
     "measured_peak_bytes", "load", "clock", "threads", "page_faults", "host_costs", "replay_spread", "glue",
     "gpu_timeline_s", "host_timeline_s"}
    {"record": "op", "model", "index", "target", "phase", "cls", "kind", "flops", "bytes_read",
     "bytes_written", "inputs": ["4x128x256:float32", …], "outputs", "m", "n", "k", "groups", "distance", "group",
     "group_ops", "launches", "source", "replay_s", "host_s", "measured_s"}

Times and distances are rounded to five significant digits. ``host_cpu_s`` (each timed step's CPU time before its
final synchronisation, step.py) is absent from files written before it was recorded; so are ``glue`` (the step's
Python glue, glue.py: its seconds, the mode's counts and per-call costs) and the GPU formula's two timelines
(predict.py), which ``predicted_s`` is the longer of on a GPU.

``replay_s`` is the analytic prediction of the op's kernel (replay.py), ``measured_s`` its in-step time
(profile.py; null when the op was not matched).
"""

from __future__ import annotations

import datetime
import gzip
import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshplan.errors import SpecError
from meshplan.files import check_input
from meshplan.measure.reuse import step_distances

if TYPE_CHECKING:
    from meshplan.measure.check import CheckResult


def step_record(result: CheckResult, date: str | None = None) -> dict[str, Any]:
    p, m = result.prediction, result.measurement
    return {"record": "step", "model": result.name, "machine": result.machine,
            "date": date or datetime.date.today().isoformat(), "params": result.trace.params, "ops": len(p.ops),
            "kernels": sum(o.launches for o in p.ops), "predicted_s": p.seconds,
            "measured_s": m.timing.seconds, "steps_s": list(m.timing.times), "wall_s": list(m.timing.wall),
            "host_cpu_s": list(m.timing.host),
            "kernels_s": p.kernels, "host_s": p.host_seconds, "module_calls": p.module_calls,
            "predicted_peak_bytes": p.peak_bytes, "measured_peak_bytes": m.peak_bytes,
            "load": [m.timing.load_before, m.timing.load_after], "clock": m.timing.clock,
            "threads": result.settings.threads, "page_faults": m.timing.page_faults,
            "host_costs": p.host.to_dict(), "replay_spread": result.replay_spread,
            "glue": m.glue.to_dict() if m.glue else None, "gpu_timeline_s": p.gpu_timeline,
            "host_timeline_s": p.host_timeline}


def _g(x: float | None) -> float | None:
    """Five significant digits: plenty for timings that vary by more than that from run to run."""
    return None if x is None else float(f"{x:.5g}")


def _tensors(infos: Any) -> list[str]:
    return [f"{'x'.join(map(str, t.shape))}:{t.dtype}" for t in infos]


def op_records(result: CheckResult) -> Iterator[dict[str, Any]]:
    p, m = result.prediction, result.measurement
    distances = step_distances(result.trace.ops, result.optimizer_ops)
    sizes: dict[int, int] = {}
    for row in p.ops:
        if row.group >= 0:
            sizes[row.group] = sizes.get(row.group, 0) + 1
    measured = m.op_seconds or (None,) * len(p.ops)
    for row, dist, seconds in zip(p.ops, distances, measured, strict=True):
        op = row.op
        yield {"record": "op", "model": result.name, "index": row.index, "target": op.target, "phase": op.phase,
               "cls": row.cls, "kind": op.kind, "flops": op.flops, "bytes_read": op.bytes_read,
               "bytes_written": op.bytes_written, "inputs": _tensors(op.inputs), "outputs": _tensors(op.outputs),
               "m": _g(op.m), "n": _g(op.n), "k": _g(op.k), "groups": op.groups, "distance": _g(dist),
               "group": row.group, "group_ops": sizes.get(row.group, 1), "launches": row.launches,
               "source": row.source, "replay_s": _g(row.kernel), "host_s": _g(row.host), "measured_s": _g(seconds)}


def write_profile(path: str | Path, results: Iterable[CheckResult], date: str | None = None, *,
                  append: bool = False) -> Path:
    """Every result's step and op records as JSON lines."""
    path = Path(path)
    if not path.name.endswith((".jsonl", ".jsonl.gz")):
        raise SpecError(f"profile={str(path)!r} must end in .jsonl or .jsonl.gz")
    path.parent.mkdir(parents=True, exist_ok=True)
    opener: Callable[..., Any] = gzip.open if path.name.endswith(".gz") else open
    with opener(path, ("a" if append else "w") + "t") as f:
        for r in results:
            for rec in (step_record(r, date), *op_records(r)):
                f.write(json.dumps(rec, separators=(",", ":")) + "\n")
    return path


def append_profile(path: str | Path, result: CheckResult) -> Path:
    return write_profile(path, [result], append=True)


def read_profiles(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a .jsonl(.gz) file, or of every such file of a folder (sorted by name)."""
    path = Path(path)
    files = sorted([*path.glob("*.jsonl"), *path.glob("*.jsonl.gz")]) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise SpecError(f"profiles={str(path)!r}: no .jsonl(.gz) profile there (benchmarks/docs/measured.py writes "
                        f"them)")
    records = []
    for f in files:
        check_input(f, "profiles")
        text = gzip.decompress(f.read_bytes()).decode() if f.name.endswith(".gz") else f.read_text()
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    raise SpecError(f"profiles: {f} line {n} is not JSON") from None
                if not isinstance(record, dict) or record.get("record") not in ("step", "op") or \
                        not isinstance(record.get("model"), str):  # what step_record / op_records write
                    raise SpecError(f"profiles: {f} line {n} is not a step or op record (write_profile's)")
                records.append(record)
    return records
