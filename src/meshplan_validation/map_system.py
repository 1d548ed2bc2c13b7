"""A published record's hardware section → Cluster: the GPU count (as recorded, else nodes × GPUs per node, else the
stated parallel sizes), the system preset its GPU name names (patterns.GPU_SYSTEMS; the 40 GB A100 for a source that
predates the 80 GB part), and the preset's network and NVLink domain where the record's interconnect text, server size
or GPU count bounds them; each with a note.
"""

from __future__ import annotations

import math
import re
from typing import Any

from meshplan.fields import MAX_SIZE
from meshplan.specs.hardware import Cluster, load_system
from meshplan_validation.patterns import (
    A100_80GB_TEXT,
    A100_TEXT,
    GPU_SYSTEMS,
    MEMORY_SIZE_TEXT,
    NETWORK_TEXT,
    YEAR,
)
from meshplan_validation.records import positive_int
from meshplan_validation.skip import Skip

SERVER_DOMAIN = 8  # an NVLink domain this small is one server's baseboard (HGX / DGX / OAM), not a rack (NVL72)
# The A100 80GB was announced on 16 November 2020 (NVIDIA press release "NVIDIA Doubles Down: Announces A100 80GB
# GPU", SC20); a source from 2020 or earlier that does not state the memory ran the 40 GB part (DGX A100 320GB).
A100_80GB_FROM = 2021  # the first year a source can have run the 80 GB part all year


# ---- the hardware section as the record implies it -----------------------------------------------------------------
def hardware_section(record: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The record's hardware section with its GPU count and GPU as implied where it leaves them out
    (``gpu_count``, ``dated_a100``), and the notes that say so."""
    hardware, count_note = gpu_count(record)
    hardware, dated_note = dated_a100(record, hardware)
    return hardware, [note for note in (count_note, dated_note) if note]


def gpu_count(record: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The hardware section with ``num_gpus``: as recorded, else nodes × GPUs per node, else the product of the
    stated parallel sizes (dp·tp·pp·cp)."""
    hw = dict(record.get("hardware") or {})
    given = hw.get("num_gpus")
    if positive_int(given) or (isinstance(given, (int, float)) and not isinstance(given, bool) and given <= 0):
        return hw, ""  # a count, or a number that no count is (refused by _num_gpus, not rebuilt from the layout)
    why = "num_gpus not recorded" if hw.get("num_gpus") is None else f"num_gpus={hw['num_gpus']!r} not a size"
    nodes, per_node = positive_int(hw.get("num_nodes") or hw.get("nodes")), positive_int(hw.get("gpus_per_node"))
    if nodes and per_node:
        hw["num_gpus"] = nodes * per_node
        return hw, f"{nodes * per_node} GPUs = {nodes} nodes x {per_node} ({why})"
    p = record.get("parallel") or {}
    sizes = [positive_int(p.get(k)) for k in ("dp", "tp", "pp", "cp")]
    if sizes[0]:
        hw["num_gpus"] = math.prod(x or 1 for x in sizes)
        return hw, f"{hw['num_gpus']} GPUs = dp*tp*pp*cp ({why})"
    return hw, ""


def dated_a100(record: dict[str, Any], hw: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The 40 GB A100 for an unstated memory size when the source (its ``source`` / ``framework`` text) dates from
    before the 80 GB part."""
    gpu = str(hw.get("gpu") or "")
    if not A100_TEXT.search(gpu) or MEMORY_SIZE_TEXT.search(gpu):
        return hw, ""
    years = [int(y) for y in YEAR.findall(f"{record.get('source', '')} {record.get('framework', '')}")]
    if not years or max(years) >= A100_80GB_FROM:
        return hw, ""
    return hw | {"gpu": f"{gpu} 40GB"}, (f"A100 40 GB: the source dates from {max(years)}, before the 80 GB part "
                                         "(announced November 2020)")


# ---- the cluster -------------------------------------------------------------------------------------------------
def map_cluster(hw: dict[str, Any]) -> tuple[Cluster, list[str]]:
    """The cluster of the hardware section's GPUs: its GPU's system preset with the network and NVLink domain the
    record implies, and the notes that say so."""
    gpu, n = str(hw.get("gpu") or ""), _num_gpus(hw)
    preset = next((p for pattern, p in GPU_SYSTEMS if re.search(pattern, gpu, re.I)), None)
    if preset is None:
        raise Skip(f"no system preset for GPU {gpu!r} (hardware.gpu)" if gpu else "hardware.gpu missing")
    system = load_system(preset)
    notes = [f"hardware: {preset} preset"]
    if preset == "a100" and not A100_80GB_TEXT.search(gpu):
        notes.append("A100 memory size not stated: 80 GB assumed")
    preset_domain = system.network.nvlink_domain
    per_node = positive_int(hw.get("gpus_per_node"))
    _count_note(preset, n, per_node, notes)
    overrides: dict[str, Any] = {}
    network, why = _network(str(hw.get("interconnect") or ""), per_node or min(preset_domain, SERVER_DOMAIN))
    if network:
        overrides.update(network)
        notes.append(why)
    domain = _nvlink_domain(preset, preset_domain, n, per_node, notes)
    if domain != preset_domain:
        overrides["nvlink_domain"] = domain
    return system.cluster(n, **overrides), notes


def _num_gpus(hw: dict[str, Any]) -> int:
    n = positive_int(hw.get("num_gpus"))
    if not n:
        given = hw.get("num_gpus")
        raise Skip("number of GPUs not recorded: hardware.num_gpus" + (
            " missing" if given is None else f"={given!r} is not a whole number from 1 to {MAX_SIZE}")
            + ", and neither hardware.num_nodes × gpus_per_node nor parallel.dp (× tp × pp × cp) gives it")
    return int(n)


def _count_note(preset: str, n: int, per_node: int | None, notes: list[str]) -> None:
    """How the record's GPUs are counted, where that is in doubt. The MI250X preset is one GCD (ROCm's device, as
    Frontier's and LUMI's papers count); a record of 4 per server may count packages of 2 GCDs, which would halve its
    per-GPU figures against meshplan's: said, not guessed."""
    if preset == "mi250x" and per_node == 4:
        notes.append(f"MI250X: the record's {n} GPUs (4 per server) modelled as GCDs; if it counts packages of 2 "
                     "GCDs, its per-GPU figures are twice a GCD's")


def _network(text: str, per_node: int) -> tuple[dict[str, float], str]:
    """(nics_per_gpu, nic_bandwidth in B/s) overrides and their note, from the record's interconnect text; none when
    it states no count and rate. Without a rate of its own, a match's rate is its group 2 (count x rate) or, per GPU,
    its group 1."""
    for pattern, kind, per_server, rate in NETWORK_TEXT:
        found = re.search(pattern, text, re.I)
        if not found:
            continue
        count = int(found.group(1))
        nics = count / per_node if per_server else 1.0
        gbps = rate or (int(found.group(2)) if per_server else count)
        if nics <= 0 or gbps <= 0:
            return {}, ""
        why = (f"network as stated ({found.group(0).strip()!r}): {nics:g} NIC of {gbps} Gb/s per GPU"
               + (f" ({kind}, {per_node} GPUs per server)" if per_server else ""))
        return {"nics_per_gpu": nics, "nic_bandwidth": gbps * 1e9 / 8}, why
    return {}, ""


def _nvlink_domain(preset: str, domain: int, n: int, per_node: int | None, notes: list[str]) -> int:
    """The NVLink domain of the run: the preset's ``domain``, bounded by the record's servers where they are smaller
    than one server's baseboard, then by the largest divisor of the GPU count within it where the count is not a
    multiple of it."""
    if per_node and per_node < domain <= SERVER_DOMAIN:  # one server's NVLink domain, bigger than the record's servers
        notes.append(f"NVLink domain {per_node} (the record's servers hold {per_node} GPUs; the preset's {preset} "
                     f"server {domain})")
        domain = per_node
    if n > domain and n % domain:
        per_node = per_node or 1
        fitting = [d for d in range(domain, 0, -1) if n % d == 0 and d % per_node == 0] or [math.gcd(n, domain)]
        notes.append(f"NVLink domain {fitting[0]} ({n} GPUs are not a multiple of {domain}: "
                     f"the largest divisor of the GPU count within one NVLink domain)")
        return fitting[0]
    return domain
