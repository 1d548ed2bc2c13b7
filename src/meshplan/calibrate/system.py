"""A calibration as a hardware TOML in the schema of presets/hardware/*.toml, loadable by hardware.load_system.

The presets hold datasheet figures that efficiency.py derates: memory-bound kernels stream at
``memory`` × hbm_bandwidth, collectives at ``nvlink`` / ``network`` × the link bandwidth, and GEMMs at
peak × MAMF (``matmul_bf16``) × shape effects. A calibrated file writes each *measured* rate divided by the
derating the model will apply, so the model's sustained figure is the measured one:

    hbm_bandwidth    = BW_copy / memory           (STREAM copy fit, memory.py's kernels stream at this)
    kernel_overhead  = t₀ of that fit             (roofline.overhead: every kernel but tensor-core ones)
    gemm_overhead    = t₀ of the 16-bit GEMM fit  (roofline.overhead: GEMMs and attention kernels)
    nvlink_bandwidth = busbw_0 / nvlink           (mesh dimension 0: median bus bandwidth of its collectives)
    nic_bandwidth    = busbw_out / network        (the slowest outer dimension), nics_per_gpu = 1
    nvlink_latency, nic_latency = α per step      (fit.py: intercept / comm.py's latency steps)
    nccl_protocols   = false                      (dimension 0 measured: its collectives at that α, protocols.py)
    matmul_bf16      = F / peak                   (F: the GEMM fit's asymptotic rate when its t₀ is written, else
                                                   the best GEMM measured, the definition of MAMF; peak from
                                                   ``base``, else F itself with matmul_bf16 = 1)
    attention_flops  = F of the attention fit     (causal scaled_dot_product_attention at 16 bits; not derated:
                                                   roofline.py runs flash attention at this rate when it is set;
                                                   the fit's F beside its t₀, else the best measured, as GEMMs)
    attention_overhead = t₀ of that fit           (roofline.overhead: attention kernels)

The fits' intercepts t₀ enter the roofline as t = t₀ + work(compute, memory) (roofline.py; Hockney's r∞ / n½
model, fit.py). A fit's t₀ is written only where the fit is good (R² ≥ GOOD_FIT) and t₀ > 0: the fits are
non-negative least squares, so an intercept that noise in a fit of large kernels would pull below 0 is held at 0
(the file says so) and the GEMMs then run at the best rate measured, which holds their overhead, as before t₀
was used; the rate written with a t₀ is the fit's F, so that t₀ is not counted twice.

Meshes of three or more measured dimensions keep every one as a tier ([[network.tiers]], mesh.py): dimension 0
is tier 0 (at the accelerator's nvlink_bandwidth, derated by ``nvlink``), each further dimension a tier of its
measured size at its own bus bandwidth / ``network`` and α, the outermost "the rest" (a job larger than the
measured mesh grows the outermost dimension). Meshes of one or two dimensions keep the two-tier form.
Figures a run cannot measure (TDP, fp8, host links; the network of a single-domain run) come from ``base``
when given, each marked so; a single-domain run without a base repeats tier 0 for the network tier, which a
job that fits in the domain never uses.
"""

from __future__ import annotations

import json
from pathlib import Path

from meshplan.calibrate.fit import MAX_DISPATCH, MemoryFit, TierFit
from meshplan.calibrate.run import Calibration
from meshplan.errors import SpecError
from meshplan.files import write_text
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.specs.hardware import System
from meshplan.units import fmt_bytes

GOOD_FIT = 0.9  # R² below which a fit is noise: the best observed rate is written, and no intercept
# tier 0 measured: its collectives at the fitted α per step, not NCCL's protocol constants (protocols.py)
_PROTOCOLS = ("nccl_protocols = false  # tier 0 measured: its collectives at the α fitted there "
              "(meshplan.collectives.protocols)")


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
    lines += gemm + _attention_lines(cal) + _memory_lines(cal, base, eff)
    lines += [f"source = {_str(source)}", "", "[accelerator.peak_flops]", f"# {peak_note}"]
    lines += [f"{p} = {_num(v)}  # {v / 1e12:.4g} TFLOP/s" for p, v in peaks.items()]
    if len(cal.tiers) >= 3:
        protocols = [_PROTOCOLS] if cal.tiers[0].dim == 0 else []
        lines += ["", "[network]"] + _host_lines(base) + protocols + [f"source = {_str(source)}"]
        lines += _tier_tables(cal, eff)
    else:
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
    fastest = min((2 * m * n * k / rate for m, n, k, rate in half.shapes if rate > 0), default=float("inf"))
    t0, overhead_note = _intercept(half.overhead, half.r2, f"{half.precision} GEMM fit", fastest)
    rate = half.rate if t0 > 0 else half.best  # the fit's F beside its t₀, else the best measured
    lines = [f"gemm_overhead = {_num(t0)}  # {overhead_note}"]
    if acc is not None:
        assert base is not None  # acc is its accelerator
        peaks = dict(acc.peak_flops)
        mamf = rate / acc.half_flops
        lines += [f"tdp_watts = {_num(acc.tdp_watts)}  # from {base.name}",
                  f"matmul_watts = {_num(acc.tdp_watts)}  # measured at this part's own power limit: clock factor 1"]
        if acc.matmul_fp8:
            lines.append(f"matmul_fp8 = {_num(acc.matmul_fp8)}  # not measured: from {base.name}")
        if acc.async_mma is not None:
            lines.append(f"async_mma = {str(acc.async_mma).lower()}  # from {base.name}")
        peak_note = f"datasheet dense peaks from {base.name}"
    else:
        peaks = {p: f.rate if t0 > 0 else f.best for p, f in fits.items()}
        mamf = 1.0
        peak_note = ("GEMM fits' asymptotic rate per precision (beside gemm_overhead" if t0 > 0 else
                     "best measured GEMM rate per precision (") + "; no datasheet peak given: matmul_bf16 = 1)"
    m, n, k = half.best_shape
    what = (f"fit's F {rate / 1e12:.4g} TFLOP/s (best {half.best / 1e12:.4g} at {m}x{n}x{k})" if t0 > 0
            else f"best {half.precision} GEMM {half.best / 1e12:.4g} TFLOP/s at {m}x{n}x{k}")
    lines.append(f"matmul_bf16 = {_num(mamf)}  # {what} / peak "
                 f"{peaks.get('bf16', peaks.get('fp16', rate)) / 1e12:.4g}")
    return lines, peaks, peak_note


def _attention_lines(cal: Calibration) -> list[str]:
    """The measured causal attention rate and its t₀ (none without attention samples: the model keeps pricing
    attention from the peak and efficiency.py)."""
    fit = cal.attention
    if fit is None:
        return []
    t0, note = _intercept(fit.overhead, fit.r2, f"{fit.precision} attention fit")
    b, a, s, d = fit.best_shape
    what = (f"fit's F {fit.rate / 1e12:.4g} TFLOP/s (best {fit.best / 1e12:.4g} at {b}x{a}x{s}x{d})" if t0 > 0
            else f"best {fit.precision} causal attention {fit.best / 1e12:.4g} TFLOP/s at {b}x{a}x{s}x{d}")
    return [f"attention_flops = {_num(fit.rate if t0 > 0 else fit.best)}  # {what} (batch x heads x seq x head_dim)",
            f"attention_overhead = {_num(t0)}  # {note}"]


def _intercept(t0: float, r2: float, fit: str, fastest: float = float("inf")) -> tuple[float, str]:
    """A fit's intercept as a per-kernel overhead (seconds) and why: kept when the fit is good, t₀ > 0 and t₀ is
    physical, else 0 (the fits are non-negative least squares, fit.nnls: an intercept the data would pull below 0 is
    held at 0). Physical (issue 48: a 15.1 ms overhead passed on R² 0.964): below ``fastest``, the quickest kernel
    the fit measured (a fixed part of a kernel's time cannot exceed the whole of it), and below MAX_DISPATCH, the
    bound calibrate already puts on the host's fixed cost per call (launch, ramp and dispatch are microseconds; an
    intercept of milliseconds is a line drawn through kernels too large to show one)."""
    if r2 < GOOD_FIT:
        return 0.0, f"{fit} R² {r2:.2f} < {GOOD_FIT}: its intercept is noise, not used"
    if t0 <= 0:
        return 0.0, f"{fit} intercept held at 0 by the non-negative fit (no fixed overhead measured)"
    if t0 >= min(fastest, MAX_DISPATCH):
        bound = "its fastest kernel's time" if fastest < MAX_DISPATCH else f"{MAX_DISPATCH * 1e6:g} us"
        return 0.0, f"{fit} intercept t0 = {t0 * 1e6:.3g} us is not below {bound}: no fixed cost per kernel, not used"
    return t0, f"{fit} intercept t0 = {t0 * 1e6:.3g} us (R² {r2:.3f})"


def _memory_lines(cal: Calibration, base: System | None, eff: Efficiency) -> list[str]:
    """Device memory, its streaming bandwidth and the innermost link (mesh dimension 0)."""
    if cal.memory_bytes > 0:
        lines = [f"hbm_bytes = {_num(cal.memory_bytes)}  # device memory: {fmt_bytes(cal.memory_bytes)}"]
    elif base is not None:
        lines = [f"hbm_bytes = {_num(base.accelerator.hbm_bytes)}  # not measured: from {base.name}"]
    else:
        raise SpecError("calibration has no device memory size (memory_bytes=0) and no base system")
    stream, how, fit = _stream_bandwidth(cal)
    lines.append(f"hbm_bandwidth = {_num(stream / eff.memory)}  # {how} {stream / 1e9:.4g} GB/s / {eff.memory}")
    t0, note = _intercept(fit.overhead, fit.r2, f"{fit.op} fit")
    lines.append(f"kernel_overhead = {_num(t0)}  # {note}")
    inner, _ = _tiers(cal)
    if inner is not None:
        lines.append(f"nvlink_bandwidth = {_num(inner.bandwidth / eff.nvlink)}  # dim 0 busbw "
                     f"{inner.bandwidth / 1e9:.4g} GB/s ({', '.join(inner.kinds)}) / {eff.nvlink}")
    elif base is not None:
        lines.append(f"nvlink_bandwidth = {_num(base.accelerator.nvlink_bandwidth)}  # not measured: from {base.name}")
    else:
        raise SpecError(f"mesh {'x'.join(map(str, cal.mesh))} measured no links: give a base system for the link "
                        "figures")
    return lines


def _network_lines(cal: Calibration, base: System | None, eff: Efficiency) -> list[str]:
    """The [network] table: latencies and the outer tier's bandwidth, measured or from the base system."""
    inner, outer = _tiers(cal)
    if inner is not None:
        lines = [f"nvlink_latency = {_num(inner.latency)}  # α per step, {inner.latency * 1e6:.3g} us", _PROTOCOLS]
    else:
        assert base is not None  # _memory_lines refuses a calibration with neither links nor a base system
        lines = [f"nvlink_latency = {_num(base.network.scale_up_latency)}  # not measured: from {base.name}"]
    lines.append("nics_per_gpu = 1  # the measured bus bandwidth is per rank")
    if outer is not None:
        lines += [f"nic_bandwidth = {_num(outer.bandwidth / eff.network)}  # dim {outer.dim} busbw "
                  f"{outer.bandwidth / 1e9:.4g} GB/s ({', '.join(outer.kinds)}) / {eff.network}",
                  f"nic_latency = {_num(outer.latency)}  # α per step, {outer.latency * 1e6:.3g} us"]
    elif base is not None:
        net = base.network
        lines += [f"nic_bandwidth = {_num(net.scale_out_bandwidth)}  # not measured: from {base.name}",
                  f"nic_latency = {_num(net.scale_out_latency)}  # not measured: from {base.name}"]
    else:
        assert inner is not None  # as above: without a base system the links were measured
        lines += [f"nic_bandwidth = {_num(inner.bandwidth / eff.network)}  # not measured (one domain): tier 0's",
                  f"nic_latency = {_num(inner.latency)}  # not measured (one domain): tier 0's"]
    return lines + _host_lines(base)


def _host_lines(base: System | None) -> list[str]:
    if base is None:
        return []
    return [f"host_bandwidth = {_num(base.network.host_bandwidth)}  # from {base.name}",
            f"host_memory = {_num(base.network.host_memory)}  # from {base.name}"]


def _tier_tables(cal: Calibration, eff: Efficiency) -> list[str]:
    """Every measured mesh dimension as a [[network.tiers]] table, innermost first (the module docstring)."""
    lines, measured = [], cal.tiers
    for i, t in enumerate(measured):
        lines += ["", "[[network.tiers]]", f'name = "dim{t.dim}"']
        if i == len(measured) - 1:
            lines.append(f'size = "rest"  # measured {t.group}: a larger job grows the outermost dimension')
        else:
            lines.append(f"size = {t.group}  # mesh dimension {t.dim}")
        if t.dim == 0:
            lines.append("# bandwidth: the accelerator's nvlink_bandwidth (dimension 0)")
        else:  # tier 0 is derated as NVLink, the tiers beyond it as a network (efficiency.link)
            derate = eff.link(i)
            lines.append(f"bandwidth = {_num(t.bandwidth / derate)}  # dim {t.dim} busbw "
                         f"{t.bandwidth / 1e9:.4g} GB/s ({', '.join(t.kinds)}) / {derate}")
        lines.append(f"latency = {_num(t.latency)}  # α per step, {t.latency * 1e6:.3g} us")
    return lines


def write_system(cal: Calibration, path: str | Path, base: System | None = None, eff: Efficiency = DEFAULT) -> Path:
    path = Path(path)
    if path.suffix.lower() != ".toml":
        raise SpecError(f"out={str(path)!r} must end in .toml (load_system reads it back by that suffix)")
    return write_text(path, to_toml(cal, base, eff), "out")


def _stream_bandwidth(cal: Calibration) -> tuple[float, str, MemoryFit]:
    """The streaming rate (the copy fit's slope when the fit is good, else the best observed), how it was found,
    and the fit (whose intercept is the kernels' overhead)."""
    fits = {f.op: f for f in cal.memory}
    if not fits:
        raise SpecError("calibration has no memory-bound measurements")
    fit = fits.get("copy") or max(fits.values(), key=lambda f: f.best)
    if fit.r2 >= GOOD_FIT:
        return fit.bandwidth, f"{fit.op} fit (R² {fit.r2:.3f})", fit
    return fit.best, f"{fit.op} best observed (fit R² {fit.r2:.2f} < {GOOD_FIT})", fit


def _tiers(cal: Calibration) -> tuple[TierFit | None, TierFit | None]:
    """Dimension 0's summary and the slowest outer dimension's (bandwidth min, its latency)."""
    by_dim = {t.dim: t for t in cal.tiers}
    outer = [t for d, t in by_dim.items() if d > 0]
    return by_dim.get(0), (min(outer, key=lambda t: t.bandwidth) if outer else None)


def _num(x: float) -> str:
    return repr(float(x))


def _str(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)  # a JSON string is a valid TOML basic string
