"""Accelerators and clusters. A cluster is N accelerators arranged as an N-dimensional mesh of tiers.

Tier 0 is the NVLink (scale-up) domain: groups of ``size`` GPUs that talk at ``bandwidth`` bytes/s per GPU
per direction. A system's network states the tiers beyond it in one of two forms. Two tiers (most presets): the
scale-out network joins the NVLink domains by NICs, ``nics_per_gpu`` NICs of ``nic_bandwidth`` each, so a GPU's
share of it is ``nics_per_gpu * nic_bandwidth`` (seed 003's two-tier NVLink / InfiniBand model: the effective
inter-domain bandwidth scales with the NICs per NVLink domain). N tiers: ``[[network.tiers]]``, innermost first,
each with its size, bandwidth per GPU, latency and oversubscription (mesh.py: a rail-optimised leaf, a pod, a
tapered spine). Each tier has an α (latency per message step, seconds) and a β (1 / bandwidth), as in seed 000's
device-mesh abstraction (time_i = latency_i + bytes / bandwidth_i per mesh dimension).

Bandwidths are unidirectional per GPU: NVIDIA's "900 GB/s NVLink" for H100 is bidirectional, so 450 GB/s here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from meshplan import ranges
from meshplan.errors import SpecError
from meshplan.fields import MAX_GPUS, at_least_one, check_types, not_a_preset, require_fields, unknown_field
from meshplan.files import PRESETS, derived, parse_toml, preset_spec, read_text
from meshplan.specs.architectures import ARCHITECTURES
from meshplan.specs.mesh import Tier, TierSpec, build_tiers, check_tiers
from meshplan.units import MiB, parse_quantity

if TYPE_CHECKING:  # a cluster's measured all-reduce; imported by its users only (tests/test_startup.py)
    from meshplan.specs.allreduce_table import AllReduceTable

PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8", "mxfp8", "fp4")


@dataclass(frozen=True, kw_only=True)
class Accelerator:
    """One GPU: dense peak FLOP/s per precision, HBM capacity and bandwidth, scale-up link bandwidth."""

    name: str
    peak_flops: dict[str, float] = field(hash=False)  # precision -> dense FLOP/s (no sparsity)
    hbm_bytes: float
    hbm_bandwidth: float  # bytes/s
    nvlink_bandwidth: float  # bytes/s per GPU per direction
    num_sms: int = 132
    tdp_watts: float = 0.0
    # the board's draw while no kernel runs (nvidia-smi at 0 % utilisation), measured; 0 → specs/power.py's IDLE_SHARE
    idle_watts: float = 0.0  # of tdp_watts (derived/energy.py: a GPU waiting on a collective or the bubble draws this)
    # measured best-shape GEMM efficiency ("maximum achievable matmul FLOPS" / dense peak) and the board power it
    # was measured at (efficiency.py); 0 → from its architecture and peak (architectures.matmul_rule)
    matmul_bf16: float = 0.0
    matmul_fp8: float = 0.0  # also used for fp4
    matmul_watts: float = 0.0
    async_mma: bool | None = None  # asynchronous warpgroup MMA + TMA (Hopper, Blackwell); None → looked up
    # exponential (MUFU.EX2) throughput of the special function units per SM clock, relative to Hopper / Blackwell:
    # 2 on Blackwell Ultra; speeds up the fused attention kernels' softmax (efficiency.Efficiency.exp_factor)
    exp_rate: float = 1.0
    # the GPU architecture (architectures.ARCHITECTURES: volta, ampere, ada, hopper, blackwell, cdna2 …; "" unstated):
    # what a GPU without a measured MAMF or MMA kind gets them from (architectures.matmul_rule, async_mma)
    architecture: str = ""
    # fixed seconds per kernel beside its work (roofline.op_time: t = t0 + roofline.work_time), the intercepts
    # of calibrate's fits t = t0 + 2mnk / F (tensor-core kernels: GEMMs, attention) and t = t0 + bytes / BW (every
    # other kernel); 0 in the presets, whose efficiency model holds what they cost (efficiency.py)
    gemm_overhead: float = 0.0
    kernel_overhead: float = 0.0
    # the causal attention forward rate and per-kernel t0 as measured on this device (calibrate's fit
    # t = t0 + FLOPs / F of scaled_dot_product_attention, FLOPs counted as cost/attention.py does); 0 → not measured:
    # flash attention is priced from the 16-bit peak × efficiency.py's attention efficiency (roofline.compute_time)
    attention_flops: float = 0.0
    attention_overhead: float = 0.0
    # a small all-reduce inside the NVLink domain as measured on this GPU (the one-shot / two-shot kernels serving
    # engines run at decode's sizes): t = allreduce_latency + 2(g − 1)/g · bytes / allreduce_bandwidth for messages
    # up to allreduce_measured bytes, the largest measured (meshplan/allreduce.py); 0 → not measured, NCCL's model
    allreduce_latency: float = 0.0
    allreduce_bandwidth: float = 0.0
    allreduce_measured: float = 0.0
    l2_bandwidth: float = 0.0  # L2 cache read bandwidth, bytes/s (serve: re-read KV heads, iteration.py); 0 unstated
    l2_dies: int = 1  # dies with an L2 of their own, workgroups dealt round-robin over them (MI300X: 8 XCDs)
    # BabelStream Copy's sustained bandwidth / hbm_bandwidth here, which slows streaming kernels (roofline.py); 0: none
    hbm_copy_share: float = 0.0
    # beside the caching allocator (step/device_memory.py): the CUDA context with its kernels, NCCL's buffers a
    # communicator of two ranks / of more holds; A100's by default (a100-40gb.toml's sources) for a GPU with none
    cuda_context: float = 1573 * MiB
    nccl_pair: float = 544e6
    nccl_group: float = 688e6
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        prefix = f"{self.name}: " if isinstance(self.name, str) else ""
        check_types(self, prefix)
        if self.architecture and self.architecture not in ARCHITECTURES:
            raise SpecError(f"{prefix}architecture={self.architecture!r} is not one of "
                            f"{', '.join(ARCHITECTURES)} (or leave it out)")
        if not isinstance(self.peak_flops, dict):
            raise SpecError(f"{prefix}peak_flops={self.peak_flops!r} must be a table of precision = FLOP/s")
        unknown = set(self.peak_flops) - set(PRECISIONS)
        if unknown:
            raise SpecError(f"{prefix}peak_flops has unknown precision {sorted(unknown)[0]!r}")
        if "bf16" not in self.peak_flops and "fp16" not in self.peak_flops:
            raise SpecError(f"{prefix}peak_flops needs a 'bf16' or 'fp16' entry")
        for precision, value in self.peak_flops.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise SpecError(f"{prefix}peak_flops.{precision}={value!r} must be a finite number of FLOP/s")
        ranges.check_spec(self, prefix)  # every number in its physical range (ranges.RANGES)

    @property
    def default_precision(self) -> str:
        """The precision a run takes unless told: bf16 where the GPU has a bf16 peak, else fp16 (V100)."""
        return "bf16" if "bf16" in self.peak_flops else "fp16"

    @property
    def half_flops(self) -> float:
        """Dense 16-bit tensor-core peak (bf16, or fp16 on GPUs without bf16 such as V100): the MFU basis."""
        return self.peak_flops.get("bf16", self.peak_flops.get("fp16", 0.0))

    def flops(self, precision: str) -> float:
        """Dense peak FLOP/s for the tensor-core GEMMs of a run in ``precision``; bf16 and fp16 stand in for
        each other (same tensor-core rate on every NVIDIA GPU that has both)."""
        if precision in self.peak_flops:
            return self.peak_flops[precision]
        if precision in ("bf16", "fp16"):
            return self.half_flops
        raise SpecError(f"precision={precision} is not supported by {self.name} "
                        f"(it has {', '.join(sorted(self.peak_flops))})")


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """``num_gpus`` accelerators as a mesh: tiers from the innermost (NVLink) outwards, whose sizes multiply to
    num_gpus; ``nvlink_domain`` is tier 0's nominal size (a 4-GPU job on 8-GPU nodes has tier sizes (4, 1))."""

    name: str
    accelerator: Accelerator
    num_gpus: int
    tiers: tuple[Tier, ...]
    host_bandwidth: float = 55e9  # bytes/s per GPU to host memory (PCIe Gen5 x16 ≈ 64 GB/s raw) for offload
    host_memory: float = 256e9  # bytes of host memory per GPU that offloading may use (DGX H100: 2 TB / 8)
    python_host: float = 1.0  # the host CPU's time for PyTorch's Python-side work, relative to a DGX's x86 host
    interpreter_host: float = 0.0  # its time for interpreter-bound Python (serve engines' loops); 0: python_host
    # tier 0's NCCL collectives by NCCL's protocol constants; False: by tier 0's calibrated latency (protocols.py)
    nccl_protocols: bool = True
    allreduce_table: AllReduceTable | None = None  # tier 0's all-reduce as measured (specs/allreduce_table.py)
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.num_gpus, int) or self.num_gpus < 1:
            raise SpecError(f"gpus={self.num_gpus!r} must be a positive integer")
        at_least_one(self, ("host_bandwidth", "host_memory"))
        ranges.check_spec(self)
        product = 1
        for tier in self.tiers:
            product *= tier.size
        if product != self.num_gpus:
            sizes = " x ".join(str(t.size) for t in self.tiers)
            raise SpecError(f"mesh {sizes} = {product} GPUs does not equal gpus={self.num_gpus}")

    @property
    def nvlink_domain(self) -> int:
        return self.tiers[0].size

    @property
    def interpreter_speed(self) -> float:
        return self.interpreter_host or self.python_host

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        return tuple(t.size for t in self.tiers)


TWO_TIER = ("nvlink_latency", "nics_per_gpu", "nic_bandwidth", "nic_latency")


@dataclass(frozen=True, kw_only=True)
class Network:
    """How a system builds its mesh, in one of two forms (the module docstring).

    Two tiers: ``nvlink_domain`` GPUs at the accelerator's NVLink bandwidth, then ``nics_per_gpu`` NICs of
    ``nic_bandwidth`` per GPU. N tiers: ``tiers`` (mesh.TierSpec, innermost first) and none of the two-tier link
    fields; ``nvlink_domain`` is then tier 0's size, and setting it (``replace(network, nvlink_domain=72)``, the
    ``--nvlink-domain`` what-if) resizes tier 0 while a block of tier 1 keeps at most its GPUs (its NICs and
    switch ports do not change): 384 servers of 8 in a pod of 3,072 GPUs become 42 domains of 72 (3,024 GPUs).
    """

    nvlink_domain: int | None = None
    nvlink_latency: float | None = None
    nics_per_gpu: float | None = None
    nic_bandwidth: float | None = None  # bytes/s per NIC per direction
    nic_latency: float | None = None
    host_bandwidth: float = 55e9
    host_memory: float = 256e9
    python_host: float = 1.0  # Cluster.python_host
    interpreter_host: float = 0.0  # Cluster.interpreter_host
    nccl_protocols: bool = True  # Cluster.nccl_protocols (calibrate writes false with the tier-0 latency it fitted)
    nvlink_peers: int = 0  # the two-tier form's tier 0 without a switch: mesh.Tier.peers (0: NVSwitch)
    tiers: tuple[TierSpec, ...] = ()
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        check_types(self)
        if self.tiers != ():
            self._normalise_tiers()
        else:
            missing = [n for n in ("nvlink_domain", *TWO_TIER) if getattr(self, n) is None]
            if missing:
                raise SpecError(f"missing field {missing[0]!r} (or describe the mesh as [[network.tiers]])")
        # every number in its range (ranges.RANGES), which also keeps nics_per_gpu × nic_bandwidth finite
        ranges.check_spec(self)

    def _normalise_tiers(self) -> None:
        """Check the N-tier form; tier 0's size follows ``nvlink_domain`` when that is set, and is it after."""
        if not isinstance(self.tiers, (list, tuple)):
            raise SpecError(f"tiers={self.tiers!r} must be a list of tiers ([[network.tiers]] tables)")
        tiers = tuple(self.tiers)
        check_tiers(tiers)
        given = [n for n in TWO_TIER if getattr(self, n) is not None] + ["nvlink_peers"] * (self.nvlink_peers != 0)
        if given:
            raise SpecError(f"{given[0]} belongs to the two-tier form: with [[network.tiers]], give each tier its "
                            "bandwidth and latency" + (" (tier 0 its peers)" if given[0] == "nvlink_peers" else ""))
        if self.nvlink_domain is not None and self.nvlink_domain != tiers[0].size:  # tier 1 keeps its GPUs
            old, new = tiers[0].size, self.nvlink_domain
            outer = replace(tiers[1], size=max(1, tiers[1].size * old // new)) if tiers[1].size else tiers[1]
            tiers = (replace(tiers[0], size=new), outer, *tiers[2:])
        object.__setattr__(self, "tiers", tiers)
        object.__setattr__(self, "nvlink_domain", tiers[0].size)

    @property
    def scale_out_bandwidth(self) -> float:
        """Bytes/s per GPU per direction of the first tier beyond the NVLink domain (the NICs' share)."""
        if self.tiers:
            return self.tiers[1].effective_bandwidth
        assert self.nics_per_gpu is not None and self.nic_bandwidth is not None  # the two-tier form (__post_init__)
        return self.nics_per_gpu * self.nic_bandwidth

    @property
    def scale_out_latency(self) -> float:
        return self.tiers[1].latency if self.tiers else _given(self.nic_latency)

    @property
    def scale_up_latency(self) -> float:
        return self.tiers[0].latency if self.tiers else _given(self.nvlink_latency)


_T = TypeVar("_T")


def _given(value: _T | None) -> _T:
    """A two-tier field of a Network in the two-tier form, which __post_init__ has checked is set."""
    assert value is not None
    return value


@dataclass(frozen=True, kw_only=True)
class System:
    """A system preset: an accelerator and the network it usually ships with (DGX H100, GB200 NVL72 …)."""

    name: str
    accelerator: Accelerator
    network: Network
    source: str = field(default="", compare=False)

    def cluster(self, num_gpus: int, **network_overrides: Any) -> Cluster:
        """The mesh for ``num_gpus`` GPUs: (NVLink domain, number of domains), or one size per tier."""
        net = replace(self.network, **network_overrides) if network_overrides else self.network
        return build_cluster(self.name, self.accelerator, net, num_gpus)


def build_cluster(name: str, accelerator: Accelerator, net: Network, num_gpus: int) -> Cluster:
    if not isinstance(num_gpus, int) or num_gpus < 1:
        raise SpecError(f"gpus={num_gpus!r} must be a positive integer")
    if num_gpus > MAX_GPUS:
        raise SpecError(f"gpus={num_gpus} is more than {MAX_GPUS:,}, the largest cluster meshplan plans")
    if net.tiers:
        return Cluster(name=name, accelerator=accelerator, num_gpus=num_gpus,
                       tiers=build_tiers(net.tiers, accelerator.nvlink_bandwidth, num_gpus),
                       host_bandwidth=net.host_bandwidth, host_memory=net.host_memory, python_host=net.python_host,
                       interpreter_host=net.interpreter_host, nccl_protocols=net.nccl_protocols)
    domain = min(_given(net.nvlink_domain), num_gpus)
    if num_gpus % domain:
        raise SpecError(f"gpus={num_gpus} is not a multiple of the NVLink domain size {domain}")
    tiers = (
        Tier(name="nvlink", size=domain, bandwidth=accelerator.nvlink_bandwidth, latency=_given(net.nvlink_latency),
             peers=net.nvlink_peers),
        Tier(name="network", size=num_gpus // domain, bandwidth=net.scale_out_bandwidth,
             latency=_given(net.nic_latency)),
    )
    return Cluster(name=name, accelerator=accelerator, num_gpus=num_gpus, tiers=tiers,
                   host_bandwidth=net.host_bandwidth, host_memory=net.host_memory, python_host=net.python_host,
                   interpreter_host=net.interpreter_host, nccl_protocols=net.nccl_protocols)


# ---- loading ----------------------------------------------------------------------------------------------
def _table(data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise SpecError(f"{where}={data!r} must be a table ([{where.rsplit('.', 1)[-1]}] with its keys)")
    return dict(data)


def _known(data: dict[str, Any], cls: type, where: str) -> None:
    """An unknown key is a one-line error listing the known ones (as model_from_dict does)."""
    known = {f.name for f in fields(cls)} | {"sources"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise unknown_field(where, unknown[0], known - {"sources"}, f"meshplan.specs.hardware.{cls.__name__}'s")


def accelerator_from_dict(data: dict[str, Any], where: str) -> Accelerator:
    data = _table(data, where)
    _known(data, Accelerator, where)
    if "peak_flops" not in data:
        raise SpecError(f"{where}: missing field 'peak_flops'")
    peaks = _table(data.pop("peak_flops"), f"{where}.peak_flops")
    peak = {k: parse_quantity(v, f"{where}.peak_flops.{k}", "FLOP/s") for k, v in peaks.items()}
    data.pop("sources", None)  # per-number provenance lives in the TOML beside the numbers
    for key, unit in (("hbm_bytes", "B"), ("hbm_bandwidth", "B/s"), ("nvlink_bandwidth", "B/s"), ("gemm_overhead", "s"),
                      ("kernel_overhead", "s"), ("attention_flops", "FLOP/s"), ("attention_overhead", "s"),
                      ("allreduce_latency", "s"), ("allreduce_bandwidth", "B/s"), ("allreduce_measured", "B"),
                      ("l2_bandwidth", "B/s"), ("cuda_context", "B"), ("nccl_pair", "B"), ("nccl_group", "B")):
        if key in data:
            data[key] = parse_quantity(data[key], f"{where}.{key}", unit)
    require_fields(data, Accelerator, where, given=("peak_flops",))
    try:
        return Accelerator(peak_flops=peak, **data)
    except (TypeError, SpecError) as exc:  # a required field left out, or a value the spec refuses
        raise SpecError(f"{where}: {exc}") from None


_NETWORK_UNITS = {"nvlink_latency": "s", "nic_bandwidth": "B/s", "nic_latency": "s", "host_bandwidth": "B/s",
                  "host_memory": "B"}


def network_from_dict(data: dict[str, Any], where: str) -> Network:
    data = _table(data, where)
    _known(data, Network, where)
    data.pop("sources", None)
    for key, unit in _NETWORK_UNITS.items():
        if key in data:
            data[key] = parse_quantity(data[key], f"{where}.{key}", unit)
    if "tiers" in data:
        if "nvlink_domain" in data:
            raise SpecError(f"{where}: nvlink_domain and tiers are both given: tier 0's size is the NVLink domain")
        data["tiers"] = _tiers_from(data["tiers"], f"{where}.tiers")
    require_fields(data, Network, where)
    try:
        return Network(**data)
    except (TypeError, SpecError) as exc:  # a required field left out, or a value the spec refuses
        raise SpecError(f"{where}: {exc}") from None


_TIER_UNITS = {"bandwidth": "B/s", "latency": "s"}


def _tiers_from(data: Any, where: str) -> tuple[TierSpec, ...]:
    """[[network.tiers]]: a list of tables, each a TierSpec; ``size = "rest"`` (or no size) on the outermost."""
    if not isinstance(data, list) or not data:
        raise SpecError(f"{where}={data!r} must be a list of tables ([[network.tiers]], innermost first)")
    tiers = []
    for i, entry in enumerate(data):
        here = f"{where}[{i}]"
        entry = _table(entry, here)
        _known(entry, TierSpec, here)
        entry.pop("sources", None)
        for key, unit in _TIER_UNITS.items():
            if key in entry:
                entry[key] = parse_quantity(entry[key], f"{here}.{key}", unit)
        if entry.get("size") == "rest":
            entry["size"] = 0
        require_fields(entry, TierSpec, here)
        try:
            tiers.append(TierSpec(**entry))
        except (TypeError, SpecError) as exc:
            raise SpecError(f"{here}: {exc}") from None
    return tuple(tiers)


def system_from_dict(data: dict[str, Any], where: str) -> System:
    try:
        acc = accelerator_from_dict(data["accelerator"], f"{where}.accelerator")
        net = network_from_dict(data["network"], f"{where}.network")
    except KeyError as exc:
        raise SpecError(f"{where}: missing table [{exc.args[0]}]") from None
    system = System(name=data.get("name", where), accelerator=acc, network=net, source=data.get("source", ""))
    check_types(system, f"{where}: ")
    return system


def system_names() -> list[str]:
    root = PRESETS / "hardware"
    return sorted(p.name.removesuffix(".toml") for p in root.iterdir() if p.name.endswith(".toml"))


def load_system(ref: str, field: str = "system") -> System:
    """A system preset name (``h100``, ``gb200`` …) or a TOML file in the same format (``field``: the option
    that named it, for errors)."""
    path = Path(ref)
    if path.suffix.lower() == ".toml":
        text, where = read_text(path, field), f"{field}={str(path)!r}"
        return system_from_dict(derived(parse_toml(text, f"{field}={ref!r}"), path, where, PRESETS / "hardware"), where)
    if ref not in system_names():
        raise not_a_preset(field, ref, system_names(), "a preset or a .toml file")
    return preset_spec(f"hardware/{ref}.toml", f"{field}={ref!r}", system_from_dict, f"preset {ref}")
