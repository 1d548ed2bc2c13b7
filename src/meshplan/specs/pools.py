"""A mixed cluster: pools of different GPUs (an H100 pool beside an A100 one, H200 beside B200), each a system preset
with its own NVLink domains and network, joined by the datacenter fabric (issue 84 item 1; Metis, Um et al., USENIX
ATC '24; HexiScale, Yan et al., arXiv 2409.01143; Sailor, Strati et al., SOSP '25; Cephalo, Guo et al., ICS '25).

A tensor-, context- or expert-parallel group never leaves a pool (an NVLink domain holds one kind of GPU); what
crosses between pools is a pipeline's sends from a stage on one pool to the next on another, or the data-parallel
collectives of replicas on different pools (meshplan/derived/mixed.py prices both). Each GPU reaches the other pool
through its own NICs, so a flow between pools runs at the slower end's share of the fabric: ``link_bandwidth`` per GPU,
by default the smaller of the pools' scale-out bandwidths (both on one fabric), less where the pools are joined by a
slower link (another building: give it).

On the command line: ``--system h100:32,a100:32`` (preset:GPUs, comma-separated), or a TOML file with ``[[pools]]``
tables (``system``, ``gpus``) and an optional ``[link]`` (``bandwidth``, ``latency``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshplan.errors import SpecError
from meshplan.fields import MAX_GPUS
from meshplan.files import parse_toml, read_text
from meshplan.specs.hardware import Cluster, System, load_system
from meshplan.units import parse_quantity

MAX_POOLS = 4  # the pool orders a pipeline may take are tried (4! = 24)


@dataclass(frozen=True, kw_only=True)
class GpuPool:
    """``gpus`` GPUs of one system (its accelerator, NVLink domain and network)."""

    system: System
    gpus: int

    @property
    def name(self) -> str:
        return self.system.name

    def cluster(self, gpus: int | None = None) -> Cluster:
        """``gpus`` GPUs (default: the pool's) laid out on this pool's mesh."""
        return self.system.cluster(self.gpus if gpus is None else gpus)


@dataclass(frozen=True, kw_only=True)
class Pools:
    """The pools of a mixed cluster and the link between them (module docstring)."""

    pools: tuple[GpuPool, ...]
    link_bandwidth: float = 0.0  # bytes/s per GPU between pools; 0: the slower pool's scale-out bandwidth
    link_latency: float = 0.0  # seconds; 0: the larger of the pools' scale-out latencies
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not 2 <= len(self.pools) <= MAX_POOLS:
            raise SpecError(f"system: a mixed cluster has 2 to {MAX_POOLS} pools (got {len(self.pools)})")
        for pool in self.pools:
            domain = pool.system.network.nvlink_domain or 1
            if pool.gpus < 1 or (pool.gpus > domain and pool.gpus % domain):
                raise SpecError(f"system: pool {pool.name}:{pool.gpus} must be a positive number of GPUs, a multiple "
                                f"of its NVLink domain of {domain}")
        if self.num_gpus > MAX_GPUS:
            raise SpecError(f"system: {self.num_gpus} GPUs is more than {MAX_GPUS:,}, the largest cluster meshplan "
                            "plans")
        if not (0 <= self.link_bandwidth <= 1e13 and 0 <= self.link_latency <= 1.0):
            raise SpecError(f"link bandwidth={self.link_bandwidth:g} B/s and latency={self.link_latency:g} s must be "
                            "from 0 (the pools' own) to 10 TB/s and 1 s")

    @property
    def num_gpus(self) -> int:
        return sum(p.gpus for p in self.pools)

    @property
    def name(self) -> str:
        return ",".join(f"{p.name}:{p.gpus}" for p in self.pools)

    @property
    def bandwidth(self) -> float:
        """Bytes/s per GPU of a flow between pools (module docstring)."""
        own = min(p.system.network.scale_out_bandwidth for p in self.pools)
        return min(own, self.link_bandwidth) if self.link_bandwidth else own

    @property
    def latency(self) -> float:
        own = max(p.system.network.scale_out_latency for p in self.pools)
        return max(own, self.link_latency)


def is_pools(ref: str) -> bool:
    """Whether ``--system`` names a mixed cluster: preset:GPUs pairs, or a TOML file with [[pools]]."""
    if ":" in ref and not ref.lower().endswith(".toml"):
        return True
    path = Path(ref)
    return path.suffix.lower() == ".toml" and path.is_file() and "[[pools]]" in path.read_text(errors="replace")


def parse_pools(ref: str) -> Pools:
    """``h100:32,a100:32`` or a TOML file of [[pools]] (module docstring)."""
    if ref.lower().endswith(".toml"):
        return _from_toml(parse_toml(read_text(Path(ref), "system"), f"system={ref!r}"), ref)
    pools = []
    for part in ref.split(","):
        name, _, count = part.strip().partition(":")
        if not name or not count.strip().isdigit():
            raise SpecError(f"system={ref!r} must be preset:GPUs pairs separated by commas, e.g. h100:32,a100:32")
        pools.append(GpuPool(system=load_system(name.strip()), gpus=int(count)))
    return Pools(pools=tuple(pools))


def _from_toml(data: dict[str, Any], where: str) -> Pools:
    entries = data.get("pools")
    if not isinstance(entries, list):
        raise SpecError(f"system={where!r}: [[pools]] tables (system, gpus) are missing")
    pools = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or set(entry) - {"system", "gpus", "source"} or "system" not in entry:
            raise SpecError(f"system={where!r}: pools[{i}] must have system and gpus (and a source)")
        gpus = entry.get("gpus")
        if not isinstance(gpus, int) or isinstance(gpus, bool):
            raise SpecError(f"system={where!r}: pools[{i}].gpus={gpus!r} must be a whole number of GPUs")
        pools.append(GpuPool(system=load_system(str(entry["system"])), gpus=gpus))
    link = data.get("link", {})
    if not isinstance(link, dict) or set(link) - {"bandwidth", "latency", "source"}:
        raise SpecError(f"system={where!r}: [link] takes bandwidth (per GPU) and latency")
    bandwidth = parse_quantity(link["bandwidth"], "link.bandwidth", "B/s") if "bandwidth" in link else 0.0
    latency = parse_quantity(link["latency"], "link.latency", "s") if "latency" in link else 0.0
    return Pools(pools=tuple(pools), link_bandwidth=bandwidth, link_latency=latency, source=str(data.get("source", "")))
