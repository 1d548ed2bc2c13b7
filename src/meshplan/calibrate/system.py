"""A calibration as a hardware TOML in the schema of presets/hardware/*.toml, loadable by hardware.load_system.

The presets hold datasheet figures that efficiency.py derates: memory-bound kernels stream at
``memory`` × hbm_bandwidth, collectives at ``nvlink`` / ``network`` × the link bandwidth, and GEMMs at
peak × MAMF (``matmul_bf16``) × shape effects. A calibrated file writes each *measured* rate divided by the
derating the model will apply, so the model's sustained figure is the measured one:

    hbm_bandwidth    = BW_copy / memory           (STREAM copy fit, memory.py's kernels stream at this)
    nvlink_bandwidth = busbw_0 / nvlink           (mesh dimension 0: median bus bandwidth of its collectives)
    nic_bandwidth    = busbw_out / network        (the slowest outer dimension), nics_per_gpu = 1
    nvlink_latency, nic_latency = α per step      (fit.py: intercept / comm.py's latency steps)
    matmul_bf16      = best bf16 GEMM / peak      (the definition of MAMF; peak from ``base``, else the
                                                   measured best itself with matmul_bf16 = 1)

Figures a run cannot measure (TDP, fp8, host links; the network of a single-domain run) come from ``base``
when given, each marked so; a single-domain run without a base repeats tier 0 for the network tier, which a
job that fits in the domain never uses. Meshes of three or more dimensions collapse to hardware.py's two
tiers: dimension 0 is the NVLink domain, the rest one network tier at the slowest outer dimension's figures.
"""

from __future__ import annotations

import json
from pathlib import Path

from meshplan.calibrate.fit import TierFit
from meshplan.calibrate.run import Calibration
from meshplan.errors import SpecError
from meshplan.files import write_text
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.specs.hardware import System
from meshplan.units import fmt_bytes

GOOD_FIT = 0.9  # R² below which a memory fit's slope is noise: the best observed rate is written instead


def to_toml(cal: Calibration, base: System | None = None, eff: Efficiency = DEFAULT, name: str | None = None) -> str:
    """The calibrated system as TOML text (see the module docstring for what goes where)."""
    source = f"calibrated on {cal.host} {cal.date} by meshplan calibrate"
    mesh = "x".join(map(str, cal.mesh))
    lines = [
        f"# {cal.device_name}: {cal.world_size} ranks over {cal.backend}, mesh {mesh} (innermost first).",
        "# Measured rates are divided by efficiency.py's deratings so that the model sustains what was measured",
        "# (meshplan.calibrate.system). Regenerate with `meshplan calibrate --out FILE`.",
        f"name = {_str(name or f'calibrated-{cal.host}')}",
        f"source = {_str(source)}",
        "",
        "[accelerator]",
        f"name = {_str(f'{cal.device_name} (calibrated)')}",
        f"num_sms = {max(1, cal.num_sms)}" + ("  # CPU: cores stand in for SMs" if cal.device == "cpu" else ""),
    ]
    gemm, peaks, peak_note = _gemm_lines(cal, base)
    lines += gemm + _memory_lines(cal, base, eff)
    lines += [f"source = {_str(source)}", "", "[accelerator.peak_flops]", f"# {peak_note}"]
    lines += [f"{p} = {_num(v)}  # {v / 1e12:.4g} TFLOP/s" for p, v in peaks.items()]
    lines += ["", "[network]", f"nvlink_domain = {cal.mesh[0]}  # mesh dimension 0"]
    lines += _network_lines(cal, base, eff) + [f"source = {_str(source)}"]
    return "\n".join(lines) + "\n"


def _gemm_lines(cal: Calibration, base: System | None) -> tuple[list[str], dict[str, float], str]:
    """GEMMs: peak × matmul_bf16 = the best measured 16-bit rate; the peaks and where they come from."""
    acc = base.accelerator if base is not None else None
    fits = {f.precision: f for f in cal.gemm}
    half = fits.get("bf16") or fits.get("fp16")
    if half is None:
        raise SpecError(f"calibration has no bf16 or fp16 GEMM (measured: {', '.join(fits) or 'none'})")
    lines = []
    if acc is not None:
        peaks = dict(acc.peak_flops)
        mamf = half.best / acc.half_flops
        lines += [f"tdp_watts = {_num(acc.tdp_watts)}  # from {base.name}",
                  f"matmul_watts = {_num(acc.tdp_watts)}  # measured at this part's own power limit: clock factor 1"]
        if acc.matmul_fp8:
            lines.append(f"matmul_fp8 = {_num(acc.matmul_fp8)}  # not measured: from {base.name}")
        if acc.async_mma is not None:
            lines.append(f"async_mma = {str(acc.async_mma).lower()}  # from {base.name}")
        peak_note = f"datasheet dense peaks from {base.name}"
    else:
        peaks = {p: f.best for p, f in fits.items()}
        mamf = 1.0
        peak_note = "best measured GEMM rate per precision (no datasheet peak given: matmul_bf16 = 1)"
    m, n, k = half.best_shape
    lines.append(f"matmul_bf16 = {_num(mamf)}  # best {half.precision} GEMM {half.best / 1e12:.4g} TFLOP/s "
                 f"at {m}x{n}x{k} / peak {peaks.get('bf16', peaks.get('fp16', half.best)) / 1e12:.4g}")
    return lines, peaks, peak_note


def _memory_lines(cal: Calibration, base: System | None, eff: Efficiency) -> list[str]:
    """Device memory, its streaming bandwidth and the innermost link (mesh dimension 0)."""
    acc = base.accelerator if base is not None else None
    if cal.memory_bytes > 0:
        lines = [f"hbm_bytes = {_num(cal.memory_bytes)}  # device memory: {fmt_bytes(cal.memory_bytes)}"]
    elif acc is not None:
        lines = [f"hbm_bytes = {_num(acc.hbm_bytes)}  # not measured: from {base.name}"]
    else:
        raise SpecError("calibration has no device memory size (memory_bytes=0) and no base system")
    stream, how = _stream_bandwidth(cal)
    lines.append(f"hbm_bandwidth = {_num(stream / eff.memory)}  # {how} {stream / 1e9:.4g} GB/s / {eff.memory}")
    inner, _ = _tiers(cal)
    if inner is not None:
        lines.append(f"nvlink_bandwidth = {_num(inner.bandwidth / eff.nvlink)}  # dim 0 busbw "
                     f"{inner.bandwidth / 1e9:.4g} GB/s ({', '.join(inner.kinds)}) / {eff.nvlink}")
    elif acc is not None:
        lines.append(f"nvlink_bandwidth = {_num(acc.nvlink_bandwidth)}  # not measured: from {base.name}")
    else:
        raise SpecError(f"mesh {'x'.join(map(str, cal.mesh))} measured no links: give a base system for the link "
                        "figures")
    return lines


def _network_lines(cal: Calibration, base: System | None, eff: Efficiency) -> list[str]:
    """The [network] table: latencies and the outer tier's bandwidth, measured or from the base system."""
    inner, outer = _tiers(cal)
    if inner is not None:
        lines = [f"nvlink_latency = {_num(inner.latency)}  # α per step, {inner.latency * 1e6:.3g} us"]
    else:
        lines = [f"nvlink_latency = {_num(base.network.nvlink_latency)}  # not measured: from {base.name}"]
    lines.append("nics_per_gpu = 1  # the measured bus bandwidth is per rank")
    if outer is not None:
        lines += [f"nic_bandwidth = {_num(outer.bandwidth / eff.network)}  # dim {outer.dim} busbw "
                  f"{outer.bandwidth / 1e9:.4g} GB/s ({', '.join(outer.kinds)}) / {eff.network}",
                  f"nic_latency = {_num(outer.latency)}  # α per step, {outer.latency * 1e6:.3g} us"]
    elif base is not None:
        net = base.network
        lines += [f"nic_bandwidth = {_num(net.nics_per_gpu * net.nic_bandwidth)}  # not measured: from {base.name}",
                  f"nic_latency = {_num(net.nic_latency)}  # not measured: from {base.name}"]
    else:
        lines += [f"nic_bandwidth = {_num(inner.bandwidth / eff.network)}  # not measured (one domain): tier 0's",
                  f"nic_latency = {_num(inner.latency)}  # not measured (one domain): tier 0's"]
    if base is not None:
        lines += [f"host_bandwidth = {_num(base.network.host_bandwidth)}  # from {base.name}",
                  f"host_memory = {_num(base.network.host_memory)}  # from {base.name}"]
    return lines


def write_system(cal: Calibration, path: str | Path, base: System | None = None, eff: Efficiency = DEFAULT) -> Path:
    path = Path(path)
    if path.suffix.lower() != ".toml":
        raise SpecError(f"out={str(path)!r} must end in .toml (load_system reads it back by that suffix)")
    return write_text(path, to_toml(cal, base, eff), "out")


def _stream_bandwidth(cal: Calibration) -> tuple[float, str]:
    fits = {f.op: f for f in cal.memory}
    if not fits:
        raise SpecError("calibration has no memory-bound measurements")
    fit = fits.get("copy") or max(fits.values(), key=lambda f: f.best)
    if fit.r2 >= GOOD_FIT:
        return fit.bandwidth, f"{fit.op} fit (R² {fit.r2:.3f})"
    return fit.best, f"{fit.op} best observed (fit R² {fit.r2:.2f} < {GOOD_FIT})"


def _tiers(cal: Calibration) -> tuple[TierFit | None, TierFit | None]:
    """Dimension 0's summary and the slowest outer dimension's (bandwidth min, its latency)."""
    by_dim = {t.dim: t for t in cal.tiers}
    outer = [t for d, t in by_dim.items() if d > 0]
    return by_dim.get(0), (min(outer, key=lambda t: t.bandwidth) if outer else None)


def _num(x: float) -> str:
    return repr(float(x))


def _str(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)  # a JSON string is a valid TOML basic string
