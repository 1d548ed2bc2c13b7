"""check-step ``--world-size N``: a data-parallel training step over N local processes (gloo on CPU, NCCL on GPUs),
predicted and measured.

Every rank builds the same model and runs, at once (so that the calibration shares the memory system as the step
does): the trace, the replay of its signatures, the all-reduce microbenchmark at the gradients' sizes, then
interleaved rounds of replay and timed steps. The step is forward, backward of the loss divided by N, a barrier,
an all-reduce (sum) of every parameter's gradient, one after the other, and the optimizer step: the plain data
parallelism of torch.distributed without DDP's bucketing and overlap, so that each part is one term of the
prediction:

    step = compute (check-step's prediction of one rank's step, replayed on that rank)
         + Σ_gradients all-reduce(n) on the calibrated mesh (meshplan.collectives.price.collective_time: ring or tree,
           whichever is faster, α per step and bus bandwidth fitted by calibrate.fit.fit_collective on the
           microbenchmark, one tier of N ranks)

Times are by the wall clock (a rank waiting for its peers spends no CPU time), the slowest rank's; on a host
busy with other work the waits grow, so run it on a quiet machine (the fastest step, what the load disturbed
least, is reported beside the median).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from functools import partial
from typing import Any

from meshplan.calibrate.fit import LinkFit, fit_collective
from meshplan.calibrate.ranks import hand_back, run_ranks
from meshplan.calibrate.records import CollectiveSample
from meshplan.errors import SpecError
from meshplan.measure.timing import median


@dataclass(frozen=True, kw_only=True)
class DPResult:
    name: str
    world: int
    backend: str
    machine: dict[str, Any]
    compute_s: float  # predicted: one rank's step without communication
    comm_s: float  # predicted: the gradients' all-reduces
    measured_s: float  # the data-parallel step (median of the slowest rank's)
    fastest_s: float  # the fastest step (slowest rank's): what a loaded host disturbed least
    measured_comm_s: float  # the all-reduce loop alone, timed inside the step
    gradients: int
    gradient_bytes: int
    link: LinkFit
    load: float

    @property
    def predicted_s(self) -> float:
        return self.compute_s + self.comm_s

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.name, "world_size": self.world, "backend": self.backend, "machine": self.machine,
                "step": {"predicted_s": self.predicted_s, "measured_s": self.measured_s, "error": self.error,
                         "fastest_s": self.fastest_s},
                "compute": {"predicted_s": self.compute_s,
                            "measured_s": self.measured_s - self.measured_comm_s},
                "all_reduce": {"predicted_s": self.comm_s, "measured_s": self.measured_comm_s,
                               "gradients": self.gradients, "bytes": self.gradient_bytes},
                "link": asdict(self.link), "load": self.load}


def comm_time(sizes: list[int], link: LinkFit, world: int) -> float:
    """Σ all-reduce seconds of ``sizes`` on one tier of ``world`` ranks with the fitted α and bus bandwidth."""
    from meshplan.collectives.price import collective_time
    from meshplan.ranges import RANGES
    from meshplan.specs.efficiency import DEFAULT
    from meshplan.specs.hardware import Accelerator, Cluster, Tier

    # a fit below a link's physical floor (1 MB/s: gloo on a machine loaded by other work, seen once in CI at
    # 0.9999 MB/s) is priced at the floor, which the specs below accept
    bandwidth = max(link.bandwidth, RANGES["nvlink_bandwidth"].low)
    acc = Accelerator(name="host", peak_flops={"bf16": 1e12}, hbm_bytes=1e9, hbm_bandwidth=1e10,
                      nvlink_bandwidth=bandwidth)
    tier = Tier(name="nvlink", size=world, bandwidth=bandwidth / DEFAULT.link(0),
                latency=link.step_latency)
    # the fitted α, not NCCL's protocol constants (protocols.py: a calibrated tier 0)
    cluster = Cluster(name="local", accelerator=acc, num_gpus=world, tiers=(tier,), nccl_protocols=False)
    return float(sum(collective_time("all_reduce", float(n), world, 1, cluster) for n in sizes))


def _bench_sizes(sizes: list[int], count: int = 6) -> list[int]:
    """Up to ``count`` of the gradient sizes, spread geometrically from the smallest to the largest."""
    lo, hi = min(sizes), max(sizes)
    if lo == hi:
        return [lo, max(4, lo // 4)] if lo > 4 else [lo, lo * 4]
    picks = {min(sizes, key=partial(_log_distance, t=lo * (hi / lo) ** (i / (count - 1)))) for i in range(count)}
    return sorted(picks)


def _log_distance(s: float, t: float) -> float:
    return abs(math.log(s / t))


def check_data_parallel(ref: str, world: int, settings: Any, shapes: tuple = (), dtypes: tuple = ()) -> DPResult:
    """Spawn ``world`` ranks on this host (the module docstring) and return rank 0's result."""
    import torch

    if settings.device == "cuda" and world > torch.cuda.device_count():
        raise SpecError(f"world-size={world} is more than this host's {torch.cuda.device_count()} GPUs")
    settings = replace(settings, clock="wall", profile_ops=False)
    result: DPResult = run_ranks(_rank, (ref, settings, shapes, dtypes), world, settings.device, "meshplan-dp-")
    return result


def _rank(rank: int, world: int, rendezvous: str, out: str, ref: str, settings: Any, shapes: tuple,
          dtypes: tuple) -> None:
    import torch
    import torch.distributed as dist

    from meshplan.measure.check import keep_freed_memory, machine

    torch.set_num_threads(settings.threads)
    if settings.allocator == "keep" and settings.device == "cpu":
        keep_freed_memory()
    device = settings.device
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"file://{rendezvous}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=600))
    try:
        result = _measure(rank, world, ref, replace(settings, device=f"cuda:{rank}" if device == "cuda" else "cpu"),
                          shapes, dtypes)
        if rank == 0:
            hand_back(out, replace(result, machine=machine(device, settings.threads)))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _measure(rank: int, world: int, ref: str, settings: Any, shapes: tuple, dtypes: tuple) -> DPResult:
    import torch.distributed as dist

    from meshplan.measure.check import trace_step
    from meshplan.measure.command import load_target, optimizer_factory
    from meshplan.measure.host import measure_host
    from meshplan.measure.predict import predict_step
    from meshplan.measure.replay import replay_all
    from meshplan.measure.reuse import step_distances
    from meshplan.measure.signature import signatures
    from meshplan.measure.timing import load_average, make_clock

    kind = settings.device.split(":")[0]
    clock = make_clock("wall", kind, settings.threads)
    target = load_target(ref, shapes, dtypes, settings.device)
    model, inputs = target.model, target.inputs
    make = optimizer_factory(settings.optimizer, list(model.parameters()))
    trace, opt_ops = trace_step(model, inputs, make, settings.device)
    sigs = signatures([*trace.ops, *opt_ops])
    distances = step_distances(trace.ops, opt_ops)
    params = [p for p in model.parameters() if p.requires_grad]
    sizes = [p.numel() * p.element_size() for p in params]
    link = fit_collective(_bench_all_reduce(_bench_sizes(sizes), world, settings.device, clock))
    optimizer = make(params)
    step, comm = _dp_step(model, inputs, optimizer, params, world)
    host = measure_host(clock, settings.device)
    rounds, steps, comms = [], [], []
    for r in range(settings.rounds):
        rounds.append(replay_all(sigs, clock, settings.replay, settings.device, distances))
        for _ in range(settings.warmup if r == 0 else 1):
            step()
        for _ in range(settings.steps):
            dist.barrier()
            start = clock.now()
            step()
            steps.append(clock.now() - start)
            comms.append(comm[0])
    times = {s.key: median([t[s.key] for t in rounds]) for s in sigs}
    pred = predict_step(trace, opt_ops, times, host, serial=kind == "cpu")
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, (steps, comms))
    slowest = [max(g[0][i] for g in gathered) for i in range(len(steps))]
    comm_measured = median([max(g[1][i] for g in gathered) for i in range(len(steps))])
    return DPResult(name=ref, world=world, backend=dist.get_backend(), machine={}, compute_s=pred.seconds,
                    comm_s=comm_time(sizes, link, world), measured_s=median(slowest), fastest_s=min(slowest),
                    measured_comm_s=comm_measured,
                    gradients=len(sizes), gradient_bytes=sum(sizes), link=link, load=load_average())


def _dp_step(model: Any, inputs: tuple, optimizer: Any, params: list, world: int) -> tuple[Any, list[float]]:
    """The data-parallel step as a closure, and a one-slot list its all-reduce loop's seconds land in."""
    import time

    import torch.distributed as dist

    from meshplan.trace.capture import loss_of

    comm = [0.0]

    def step() -> None:
        loss = loss_of(model(*inputs))
        assert loss is not None  # a training step: some output needs a gradient
        (loss / world).backward()
        dist.barrier()  # the wait for the slowest rank's backward stays in the step, not in the all-reduce time
        start = time.perf_counter()
        for p in params:
            dist.all_reduce(p.grad)
        if params and params[0].grad.is_cuda:
            import torch

            torch.cuda.synchronize()
        comm[0] = time.perf_counter() - start
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step, comm


def _bench_all_reduce(sizes: list[int], world: int, device: str, clock: Any, repeats: int = 7,
                      ) -> list[CollectiveSample]:
    """All-reduce of each size (bytes, fp32), the median of ``repeats`` after two warm-ups; the slowest rank's."""
    import torch
    import torch.distributed as dist

    mine = []
    for n in sizes:
        buf = torch.ones(max(1, n // 4), device=device)
        for _ in range(2):
            dist.all_reduce(buf)
        runs = []
        for _ in range(repeats):
            dist.barrier()
            start = clock.now()
            dist.all_reduce(buf)
            runs.append(clock.now() - start)
        mine.append(median(runs))
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine)
    return [CollectiveSample(kind="all_reduce", dim=0, group=world, nbytes=float(max(1, n // 4) * 4),
                             seconds=max(g[i] for g in gathered)) for i, n in enumerate(sizes)]



def render_dp(result: DPResult, console: Any) -> None:
    """The data-parallel step: predicted and measured, split into compute and all-reduce."""
    from rich.table import Table

    from meshplan.units import fmt_bytes, fmt_time

    d = result.to_dict()
    m = result.machine
    console.print(f"[bold]{result.name}[/bold], data parallel over {result.world} ranks ({result.backend}) on "
                  f"{m.get('name', '')}, {m.get('threads', 1)} thread(s) per rank, load {result.load:.2f}")
    table = Table(title="predicted vs measured (wall clock, slowest rank)", title_justify="left")
    for col in ("", "predicted", "measured", "error"):
        table.add_column(col, justify="left" if not col else "right")
    for key, label in (("step", "step time"), ("compute", "  compute"), ("all_reduce", "  gradient all-reduce")):
        pred, meas = d[key]["predicted_s"], d[key]["measured_s"]
        table.add_row(label, fmt_time(pred), fmt_time(meas), f"{pred / meas - 1:+.1%}" if meas > 0 else "-")
    console.print(table)
    link = result.link
    console.print(f"all-reduce of {result.gradients} gradients, {fmt_bytes(result.gradient_bytes)} in all; fitted "
                  f"over {link.points} sizes: α {fmt_time(link.latency)} ({fmt_time(link.step_latency)} per step), "
                  f"bus bandwidth {link.bandwidth / 1e9:.3g} GB/s, R² {link.r2:.3f}, residuals "
                  f"{link.residual_rms:.1%} rms / {link.residual_max:.1%} max")
