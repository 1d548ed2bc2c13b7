"""A calibration: the records one run measured, where and when, and the fits derived from them.

``calibrate()`` measures (collectives.py, bench.py); ``Calibration`` holds the records and derives every
fitted figure from them on demand (fit.py, discover.py), so a Calibration built from synthetic records is as
good as a measured one: that is how the tests check the arithmetic end to end.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import socket
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

from meshplan.calibrate.discover import MeshGuess, discover_mesh, pair_matrices
from meshplan.calibrate.fit import (
    AttentionFit,
    DispatchFit,
    GemmFit,
    LinkFit,
    MemoryFit,
    TierFit,
    fit_attention,
    fit_collectives,
    fit_dispatch,
    fit_gemm,
    fit_memory,
    summarize_dims,
)
from meshplan.calibrate.records import (
    AttentionSample,
    CollectiveSample,
    DispatchSample,
    GemmSample,
    MemorySample,
    PairSample,
)
from meshplan.calibrate.settings import Settings, check_world_size, settings_for
from meshplan.errors import SpecError
from meshplan.specs.hardware import System


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """Measurements of one host and the mesh its collectives ran on (innermost dimension first)."""

    host: str
    date: str  # ISO 8601 day
    device: str  # cpu | cuda
    device_name: str
    memory_bytes: float  # device memory capacity (CPU: physical memory)
    num_sms: int  # streaming multiprocessors (CPU: cores)
    backend: str  # nccl | gloo | none
    world_size: int
    mesh: tuple[int, ...]
    order: tuple[int, ...] = ()  # ranks in mesh order (empty: 0 … world−1)
    peaks: Mapping[str, float] = field(default_factory=dict, hash=False)  # datasheet FLOP/s, for efficiencies
    gemm_samples: tuple[GemmSample, ...] = ()
    memory_samples: tuple[MemorySample, ...] = ()
    collective_samples: tuple[CollectiveSample, ...] = ()
    pair_samples: tuple[PairSample, ...] = ()
    attention_samples: tuple[AttentionSample, ...] = ()
    dispatch_samples: tuple[DispatchSample, ...] = ()  # host cost per eager call (dispatch.py)

    def __post_init__(self) -> None:
        product = 1
        for size in self.mesh:
            product *= size
        if not self.mesh or product != self.world_size:
            raise SpecError(f"mesh={'x'.join(map(str, self.mesh))} = {product} ranks does not equal "
                            f"world-size={self.world_size}")

    @cached_property
    def gemm(self) -> tuple[GemmFit, ...]:
        return fit_gemm(self.gemm_samples, self.peaks)

    @cached_property
    def attention(self) -> AttentionFit | None:
        return fit_attention(self.attention_samples)

    @cached_property
    def memory(self) -> tuple[MemoryFit, ...]:
        return fit_memory(self.memory_samples)

    @cached_property
    def dispatch(self) -> tuple[DispatchFit, ...]:
        return fit_dispatch(self.dispatch_samples)

    @cached_property
    def links(self) -> tuple[LinkFit, ...]:
        return fit_collectives(self.collective_samples)

    @cached_property
    def tiers(self) -> tuple[TierFit, ...]:
        return summarize_dims(self.links)

    @cached_property
    def discovered(self) -> MeshGuess | None:
        if not self.pair_samples:
            return None
        return discover_mesh(*pair_matrices(self.pair_samples, self.world_size))

    def to_dict(self) -> dict[str, Any]:
        """Everything as JSON-ready values: metadata, fits (SI units) and the raw records."""
        guess, attention = self.discovered, self.attention
        return {
            "host": self.host, "date": self.date, "device": self.device, "device_name": self.device_name,
            "memory_bytes": self.memory_bytes, "num_sms": self.num_sms, "backend": self.backend,
            "world_size": self.world_size, "mesh": list(self.mesh), "order": list(self.order or range(self.world_size)),
            "gemm": [{**asdict(f), "efficiency": f.efficiency} for f in self.gemm],
            "attention": None if attention is None else asdict(attention),
            "memory": [asdict(f) for f in self.memory],
            "dispatch": [asdict(f) for f in self.dispatch],
            "links": [asdict(f) for f in self.links],
            "tiers": [asdict(t) for t in self.tiers],
            "discovered": None if guess is None else {
                "shape": list(guess.shape), "domains": [list(d) for d in guess.domains],
                "contiguous": guess.contiguous, "tiers": [asdict(t) for t in guess.tiers]},
            "samples": {"gemm": [asdict(s) for s in self.gemm_samples],
                        "attention": [asdict(s) for s in self.attention_samples],
                        "memory": [asdict(s) for s in self.memory_samples],
                        "dispatch": [asdict(s) for s in self.dispatch_samples],
                        "collectives": [asdict(s) for s in self.collective_samples],
                        "pairs": [asdict(s) for s in self.pair_samples]},
        }


def calibrate(*, world_size: int | None = None, mesh: tuple[int, ...] | None = None, quick: bool = False,
              device: str = "auto", base: System | None = None, settings: Settings | None = None,
              gap: float = 2.0) -> Calibration:
    """Measure this host: collectives on ``world_size`` local ranks over ``mesh`` (None: discovered from the
    pairwise bandwidths), then GEMMs, causal attention, memory-bound kernels and the host's cost per eager call
    (dispatch.py) on device 0. ``base`` supplies the
    datasheet peaks that GEMM efficiencies are relative to. ``world_size`` defaults to the mesh's size, else the GPU
    count, else 2 on CPU."""
    from meshplan.calibrate.bench import (
        bench_attention,
        bench_gemm,
        bench_memory,
        device_info,
        require_torch,
        resolve_device,
        threads_of,
    )
    from meshplan.calibrate.collectives import measure_distributed
    from meshplan.calibrate.dispatch import bench_dispatch

    check_world_size(world_size)
    torch = require_torch()
    dev = resolve_device(device)
    if dev == "cuda" and world_size is not None and world_size > torch.cuda.device_count():
        raise SpecError(f"world-size={world_size} is more than this host's {torch.cuda.device_count()} GPUs")
    if world_size is None and mesh is not None:
        world_size = math.prod(mesh)
    elif world_size is None:
        world_size = max(1, torch.cuda.device_count()) if dev == "cuda" else 2
    if mesh is not None and math.prod(mesh) != world_size:
        raise SpecError(f"mesh={'x'.join(map(str, mesh))} = {math.prod(mesh)} ranks does not equal "
                        f"world-size={world_size}")
    settings = settings or settings_for(dev, quick)
    # the ranks first: on CPU they are forked, before this process has started any thread pool
    dist = measure_distributed(world_size=world_size, settings=settings, device=dev, mesh=mesh, gap=gap)
    with threads_of(settings):  # the step's thread count: GEMM and memory rates depend on it
        gemm = bench_gemm(settings, dev)
        attention = bench_attention(settings, dev)
        memory = bench_memory(settings, dev)
        dispatch = bench_dispatch(settings, dev)
    info = device_info(dev)
    peaks = _peaks(base, settings.precisions)
    return Calibration(host=socket.gethostname(), date=datetime.date.today().isoformat(), device=dev,
                       device_name=info["name"], memory_bytes=info["memory_bytes"], num_sms=info["num_sms"],
                       backend=dist.backend, world_size=world_size, mesh=dist.mesh, order=dist.order, peaks=peaks,
                       gemm_samples=tuple(gemm), memory_samples=tuple(memory),
                       collective_samples=dist.collectives, pair_samples=dist.pairs,
                       attention_samples=tuple(attention), dispatch_samples=tuple(dispatch))


def _peaks(base: System | None, precisions: tuple[str, ...]) -> dict[str, float]:
    """The base preset's dense peak for each measured precision it has (bf16 and fp16 stand in for each other)."""
    peaks: dict[str, float] = {}
    if base is None:
        return peaks
    for precision in precisions:
        with contextlib.suppress(SpecError):  # a precision the base has no peak for
            peaks[precision] = base.accelerator.flops(precision)
    return peaks
