"""Design-space sweeps: the best plan's throughput over GPU counts, systems and hardware parameters.

A sweep is a list of ``Point``s (a model, a system, a GPU count, an NVLink domain size, a global batch and,
for a hardware-parameter sweep, the parameter and its scale factor). ``search_points`` searches every point (the
exhaustive search of meshplan.search) and returns one flat row per point, in point order, whatever ran it:

- serially (``workers=1``),
- on the local cores (``concurrent.futures.ProcessPoolExecutor``, the default),
- on a Ray cluster (``ray_address="auto"`` or ``"ray://host:10001"``; ``"local"`` starts one in-process).

Rows are plain dicts of numbers and strings with the same keys in the same order (``SWEEP_COLUMNS``), so
``write_csv`` / ``write_json`` produce files that ``pandas.read_csv`` and ``pandas.read_json`` read directly;
a point where no plan fits has ``feasible = False`` and empty (NaN) metrics. Rows are deterministic (no
wall-clock fields), so the serial, pool and Ray paths give identical rows.

Two sweeps, after seed 003 (Subramanian et al. 2024, arXiv 2410.00273, Figs. 4–9):
- strong scaling: GPU counts × systems × NVLink domain sizes (``scaling_points``);
- hardware parameters: one parameter scaled by factors (``param_points``; ``PARAMS`` says what each does).
"""

from __future__ import annotations

import csv
import io
import json
import math
import multiprocessing
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, cast

from meshplan.errors import MissingDependency, SpecError
from meshplan.files import write_text
from meshplan.search import SearchResult, Space, check_space, search
from meshplan.search.explore import Explore
from meshplan.search.workers import ignore_interrupts
from meshplan.specs.hardware import Network, System, load_system
from meshplan.specs.model import ModelSpec

# parameter → (what it scales, the base value of a system)
PARAMS: dict[str, tuple[str, Callable[[System], float]]] = {
    "peak_flops": ("every dense peak FLOP/s of the accelerator", lambda s: s.accelerator.half_flops),
    "hbm_bandwidth": ("HBM bandwidth", lambda s: s.accelerator.hbm_bandwidth),
    "hbm_capacity": ("HBM capacity (bytes per GPU)", lambda s: s.accelerator.hbm_bytes),
    "nvlink_bandwidth": ("NVLink bandwidth per GPU", lambda s: s.accelerator.nvlink_bandwidth),
    "nic_bandwidth": ("network (NIC) bandwidth per GPU (every tier beyond NVLink)",
                      lambda s: s.network.scale_out_bandwidth),
    "nvlink_domain": ("NVLink domain size (GPUs)", lambda s: cast(int, s.network.nvlink_domain)),  # set (Network)
    # the α of the cost model's collectives (comm.py: time = latency per message step + bytes / bandwidth)
    "nvlink_latency": ("NVLink latency per message step (tier 0's)", lambda s: s.network.scale_up_latency),
    "nic_latency": ("network latency per message step (every tier beyond NVLink)",
                    lambda s: s.network.scale_out_latency),
    "host_bandwidth": ("host link bandwidth per GPU (offload copies, the offloaded optimizer step)",
                       lambda s: s.network.host_bandwidth),
}

SWEEP_COLUMNS = (
    "model", "system", "accelerator", "gpus", "nvlink_domain", "global_batch", "param", "factor", "value",
    "feasible", "step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "hfu",
    "peak_memory_bytes", "hbm_bytes", "plan", "dp", "tp", "pp", "cp", "ep", "etp", "vpp", "last_stage_layers",
    "micro_batch", "zero", "recompute", "recompute_modules", "sequence_parallel", "schedule", "offload_optimizer",
    "offload_activations", "evaluated",
    "feasible_plans",
    *(f"time_{c}_s" for c in ("compute", "recompute", "tp", "cp", "ep", "pp", "host", "bubble", "dp", "optimizer",
                              "offload")),
    *(f"memory_{c}_bytes" for c in ("weights", "grads", "optimizer", "activations", "buffers")),
)
_PLAN_FIELDS = ("dp", "tp", "pp", "cp", "ep", "etp", "vpp", "last_stage_layers", "micro_batch", "zero", "recompute",
                "sequence_parallel", "schedule", "offload_optimizer", "offload_activations")


@dataclass(frozen=True, kw_only=True)
class Point:
    """One search of a sweep. ``system`` is already modified for a parameter sweep (``param``, ``factor``)."""

    model: ModelSpec
    system: System
    gpus: int
    nvlink_domain: int
    global_batch: int
    space: Space
    param: str = "none"
    factor: float = 1.0
    value: float = math.nan  # the swept parameter's value at this point (SI units)
    label: str = ""  # the system's name as given (preset name or file)
    # also keep the search's Pareto front of step time and memory (the report's plan space): the row gains "front"
    explore: Explore | None = None


# ---- building points -----------------------------------------------------------------------------------------
def sweep_space(global_batch: int, all_placements: bool = True, offload: bool = True, **extra: Any) -> Space:
    """The search space of one point: everything ``meshplan plan`` considers, optionally narrowed, as ``meshplan sweep``
    searches it: no memory headroom unless given, the fastest plan first (a scaling curve, not the simplest plan)."""
    offs = (False, True) if offload else (False,)
    return Space(**{"headroom": 0.0, "prefer_simple": False, **extra}, global_batch=global_batch,
                 all_placements=all_placements, offload_optimizer=offs, offload_activations=offs)


def scaled_system(system: System, param: str, factor: float) -> System:
    """``system`` with one hardware parameter multiplied by ``factor`` (dataclasses.replace, nothing else)."""
    if param not in PARAMS:
        raise SpecError(f"param={param!r} must be one of {', '.join(PARAMS)}")
    if not factor > 0 or not math.isfinite(factor):
        raise SpecError(f"factor={factor!r} must be a positive number")
    try:
        return _scaled(system, param, factor)
    except SpecError as exc:  # the scaled value outside its range (ranges.RANGES): say which factor made it
        raise SpecError(f"param={param} factor={factor:g} on {system.name}: {exc}") from None


def _scaled(system: System, param: str, factor: float) -> System:
    acc, net = system.accelerator, system.network
    if param == "peak_flops":
        acc = replace(acc, peak_flops={k: v * factor for k, v in acc.peak_flops.items()})
    elif param == "hbm_bandwidth":
        acc = replace(acc, hbm_bandwidth=acc.hbm_bandwidth * factor)
    elif param == "hbm_capacity":
        acc = replace(acc, hbm_bytes=acc.hbm_bytes * factor)
    elif param == "nvlink_bandwidth":  # and tier 0's own bandwidth where an N-tier network states one
        acc = replace(acc, nvlink_bandwidth=acc.nvlink_bandwidth * factor)
        if net.tiers:
            net = _scaled_tiers(net, factor, outer=False)
    elif param == "nic_bandwidth":
        net = _scaled_tiers(net, factor, outer=True) if net.tiers else replace(
            net, nic_bandwidth=cast(float, net.nic_bandwidth) * factor)  # the two-tier form's, set
    elif param in ("nvlink_latency", "nic_latency"):
        outer = param == "nic_latency"
        net = _scaled_tiers(net, factor, outer=outer, field="latency") if net.tiers else replace(
            net, **{param: getattr(net, param) * factor})
    elif param == "host_bandwidth":
        net = replace(net, host_bandwidth=net.host_bandwidth * factor)
    else:  # nvlink_domain
        size = cast(int, net.nvlink_domain) * factor  # set after Network.__post_init__
        if abs(size - round(size)) > 1e-9 or round(size) < 1:
            raise SpecError(f"nvlink_domain {net.nvlink_domain} x factor {factor} = {size:g} is not a whole "
                            "number of GPUs")
        net = replace(net, nvlink_domain=int(round(size)))
    return replace(system, accelerator=acc, network=net)


def _scaled_tiers(net: Network, factor: float, outer: bool, field: str = "bandwidth") -> Network:
    """An N-tier network with the bandwidth (or ``field``) of every tier beyond NVLink (``outer``), or of tier 0,
    × ``factor``."""
    tiers = tuple(replace(t, **{field: getattr(t, field) * factor}) if (i > 0) == outer else t
                  for i, t in enumerate(net.tiers))
    return replace(net, tiers=tiers)


def scaling_points(model: ModelSpec, systems: Sequence[str | System], gpus: Sequence[int], global_batch: int,
                   nvlink: Sequence[int | None] = (None,), space: Space | None = None) -> list[Point]:
    """Strong scaling: every GPU count for every system × NVLink domain size (None: the system's own)."""
    return param_points(model, systems, gpus, global_batch, nvlink=nvlink, space=space)


def param_points(model: ModelSpec, systems: Sequence[str | System], gpus: Sequence[int], global_batch: int,
                 param: str = "none", factors: Sequence[float] = (1.0,), nvlink: Sequence[int | None] = (None,),
                 space: Space | None = None) -> list[Point]:
    """systems × NVLink sizes × GPU counts × factors of ``param`` (``"none"``: the systems as they are).

    Raises SpecError for a GPU count that is not a multiple of an NVLink domain size, or whose search space holds
    more than ``space.max_plans`` plans, before anything runs.
    """
    space = space or sweep_space(global_batch)
    if param != "none" and param not in PARAMS:
        raise SpecError(f"param={param!r} must be one of {', '.join(PARAMS)}")
    if not gpus:
        raise SpecError("no GPU counts to sweep")
    points = []
    for ref in systems:
        base = load_system(ref) if isinstance(ref, str) else ref
        label = Path(ref).stem if isinstance(ref, str) and ref.endswith(".toml") else str(getattr(ref, "name", ref))
        for domain in nvlink:
            system = base if domain is None else replace(base, network=replace(base.network, nvlink_domain=domain))
            for factor in factors if param != "none" else (1.0,):
                modified = system if param == "none" else scaled_system(system, param, factor)
                value = PARAMS[param][1](modified) if param != "none" else math.nan
                # the GPU's own 16-bit precision where the space asks for bf16 and it has none (V100: fp16)
                precise = space if space.precision != "bf16" else replace(
                    space, precision=modified.accelerator.default_precision)
                for n in gpus:
                    d = cast(int, modified.network.nvlink_domain)  # set after Network.__post_init__
                    # SpecError now for a GPU count the mesh cannot hold, or a space beyond max_plans
                    check_space(model, modified.cluster(n), precise)
                    points.append(Point(model=model, system=modified, gpus=n, nvlink_domain=d,
                                        global_batch=global_batch, space=precise, param=param, factor=float(factor),
                                        value=float(value), label=label))
    return points


# ---- evaluating one point ------------------------------------------------------------------------------------
def search_point(point: Point) -> dict[str, Any]:
    """Search one point; return its row (``SWEEP_COLUMNS``). Runs in a worker process or a Ray task."""
    cluster = point.system.cluster(point.gpus, nvlink_domain=point.nvlink_domain)
    result = search(point.model, cluster, point.space, top_k=1, explore=point.explore)
    row = result_row(point, result)
    if result.explored is not None:  # (step time, memory, plan) of the front, fastest first: not a CSV column
        row["front"] = [(t, m, plan) for t, m, plan in result.explored.front]
    return row


def result_row(point: Point, result: SearchResult) -> dict[str, Any]:
    """The row of ``point`` from its search result (the best plan's numbers; empty when none fits)."""
    cluster = result.cluster
    row: dict[str, Any] = dict.fromkeys(SWEEP_COLUMNS)
    row.update(model=point.model.name, system=point.label or point.system.name,
               accelerator=point.system.accelerator.name, gpus=point.gpus, nvlink_domain=point.nvlink_domain,
               global_batch=point.global_batch, param=point.param, factor=point.factor,
               value=None if math.isnan(point.value) else point.value, hbm_bytes=cluster.accelerator.hbm_bytes,
               feasible=bool(result.plans), evaluated=result.evaluated, feasible_plans=result.feasible)
    if result.plans:
        est = result.plans[0]
        p = est.plan
        row.update(step_time_s=est.step_time, tokens_per_s=est.tokens_per_s,
                   tokens_per_s_per_gpu=est.tokens_per_s / point.gpus, tflops_per_gpu=est.tflops_per_gpu,
                   mfu=est.mfu, hfu=est.hfu, peak_memory_bytes=est.peak_memory, plan=p.describe(),
                   **{k: getattr(p, k) for k in _PLAN_FIELDS},
                   recompute_modules="+".join(p.recompute_modules) if p.recompute == "selective" else None,
                   **{f"time_{k}_s": v for k, v in est.breakdown.items() if f"time_{k}_s" in row},
                   **{f"memory_{k}_bytes": v for k, v in est.memory.items() if f"memory_{k}_bytes" in row})
    return row


# ---- running many --------------------------------------------------------------------------------------------
def search_points(points: Sequence[Point], workers: int | None = None, ray_address: str | None = None,
                  progress: bool | Callable[[int, int], None] | None = None) -> list[dict[str, Any]]:
    """Rows of every point, in point order.

    ``workers``: local processes (default: the CPU count; 1 runs serially in this process).
    ``ray_address``: run on Ray instead: ``"auto"`` (the cluster this machine belongs to, or the Ray instance
    already initialised in this process), an address (``"ray://head:10001"``, ``"10.0.0.1:6379"``), or
    ``"local"`` (start a throw-away local instance). ``progress``: True for a rich progress bar on stderr,
    False for none, None for a bar when stderr is a terminal, or a callable ``(done, total)``.
    """
    if workers is not None and workers < 1:
        raise SpecError(f"workers={workers} must be a positive integer")
    if ray_address is not None:
        with _Progress(progress, len(points)) as tick:
            return _run_ray(points, ray_address, tick)
    workers = min(workers or os.cpu_count() or 1, len(points))
    if workers <= 1:
        rows: list[dict[str, Any] | None] = [None] * len(points)
        try:
            with _Progress(progress, len(points)) as tick:
                for i, point in enumerate(points):
                    rows[i] = search_point(point)
                    tick()
        except KeyboardInterrupt:
            raise Interrupted(rows) from None
        return rows  # type: ignore[return-value]
    return _run_pool(points, workers, progress)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during ``search_points``: ``rows`` holds the points that finished (None for the others), so that the
    caller keeps them (``meshplan sweep`` writes them) before exiting."""

    def __init__(self, rows: list[dict[str, Any] | None]) -> None:
        super().__init__(f"{sum(r is not None for r in rows)} of {len(rows)} points done")
        self.rows = rows


def _run_pool(points: Sequence[Point], workers: int, progress: bool | Callable[[int, int], None] | None
              ) -> list[dict[str, Any]]:
    from concurrent.futures import ProcessPoolExecutor, as_completed

    rows: list[dict[str, Any] | None] = [None] * len(points)
    with ProcessPoolExecutor(max_workers=workers, initializer=ignore_interrupts) as pool:
        # Submitting starts the workers (forked on Linux) before the progress bar starts its thread.
        futures = {pool.submit(search_point, p): i for i, p in enumerate(points)}
        try:
            with _Progress(progress, len(points)) as tick:
                for future in as_completed(futures):
                    rows[futures[future]] = future.result()
                    tick()
        except BaseException as exc:  # an error or Ctrl-C: wait neither for the points not started nor the running
            pool.shutdown(wait=False, cancel_futures=True)
            for child in multiprocessing.active_children():  # the pool's workers (the only children here)
                child.terminate()
            if isinstance(exc, KeyboardInterrupt):
                raise Interrupted(rows) from None
            raise
    return rows  # type: ignore[return-value]


def _run_ray(points: Sequence[Point], address: str, tick: Callable[[], None]) -> list[dict[str, Any]]:
    try:
        import ray
    except ImportError:
        raise MissingDependency("ray", "ray") from None
    started = False
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        try:
            ray.init(**kwargs) if address == "local" else ray.init(address=address, **kwargs)
        except (ConnectionError, ValueError) as exc:  # ValueError: an address Ray cannot parse
            raise SpecError(f"ray={address!r}: cannot connect to a Ray cluster ({exc})") from None
        started = True
    try:
        task = ray.remote(search_point)
        refs = [task.remote(p) for p in points]
        index = {ref: i for i, ref in enumerate(refs)}
        rows: list[dict[str, Any] | None] = [None] * len(points)
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                rows[index[ref]] = ray.get(ref)
                tick()
        return rows  # type: ignore[return-value]
    finally:
        if started:
            ray.shutdown()


class _Progress:
    """A rich progress bar on stderr (or a callable, or nothing); ``tick()`` marks one point done."""

    def __init__(self, progress: bool | Callable[[int, int], None] | None, total: int):
        self.total, self.done, self.bar, self.callback = total, 0, None, None
        if callable(progress):
            self.callback = progress
        elif progress or (progress is None and sys.stderr.isatty()):
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                                console=Console(stderr=True), transient=False)

    def __enter__(self) -> Callable[[], None]:
        if self.bar is not None:
            self.bar.__enter__()
            self.task = self.bar.add_task("sweep", total=self.total)
        return self.tick

    def tick(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done)
        if self.callback is not None:
            self.callback(self.done, self.total)

    def __exit__(self, *exc: Any) -> Literal[False]:
        if self.bar is not None:
            self.bar.__exit__(*exc)
        return False


# ---- files ---------------------------------------------------------------------------------------------------
def _cell(value: Any) -> Any:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return value


def write_csv(rows: Iterable[dict[str, Any]], path: str | Path) -> Path:
    """One header line (``SWEEP_COLUMNS``) and one line per row; missing values are empty cells (NaN in pandas)."""
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=SWEEP_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _cell(row.get(k)) for k in SWEEP_COLUMNS})
    return write_text(path, text.getvalue(), "output")


def write_json(rows: Iterable[dict[str, Any]], path: str | Path) -> Path:
    """A JSON array of row objects (``pandas.read_json(path)`` reads it as a table); missing values are null."""
    def null(v: Any) -> Any:  # NaN and infinities are not JSON
        return None if isinstance(v, float) and not math.isfinite(v) else v

    clean = [{k: null(row.get(k)) for k in SWEEP_COLUMNS} for row in rows]
    return write_text(path, json.dumps(clean, indent=1) + "\n", "output")


def read_csv(path: str | Path) -> list[dict[str, Any]]:
    """Rows back from ``write_csv`` with numbers as numbers (no pandas needed)."""
    out = []
    with Path(path).open(newline="", encoding="utf-8-sig") as f:
        for raw in csv.DictReader(f):
            out.append({k: _parse(v) for k, v in raw.items()})
    return out


def _parse(text: str) -> Any:
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
