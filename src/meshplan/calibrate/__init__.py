"""Calibration on real hardware: microbenchmarks with PyTorch, least-squares fits, mesh discovery.

    records.py      what was measured (frozen records, SI units)
    settings.py     what to measure, argument checks (no PyTorch)
    fit.py          least squares: α and busbw per collective and mesh dimension, GEMM and attention F, streaming BW,
                    host dispatch t₀ per call
    discover.py     tiers of ranks from a rank×rank bandwidth matrix
    bench.py        GEMMs, causal attention and memory-bound kernels on one device (PyTorch)
    collectives.py  pairwise ping-pong and collectives per mesh dimension (torch.distributed: NCCL or gloo)
    dispatch.py     the host's cost per eager PyTorch call (tiny ops and an nn.Module call, many back to back)
    run.py          calibrate() → Calibration (records + derived fits)
    system.py       a Calibration as a hardware TOML that hardware.load_system reads
    stackfile.py    a Calibration's host cost per kernel as a stack TOML (host_dispatch) that load_stack reads
    report.py       rich tables

PyTorch is imported only by bench.py, dispatch.py and collectives.py, inside their functions: the fits, mesh
discovery and the TOML writers work without it.
"""

from meshplan.calibrate.discover import MeshGuess, discover_mesh, pair_matrices
from meshplan.calibrate.fit import fit_attention, fit_collectives, fit_gemm, fit_memory, linear_fit
from meshplan.calibrate.records import AttentionSample, CollectiveSample, GemmSample, MemorySample, PairSample
from meshplan.calibrate.run import Calibration, calibrate
from meshplan.calibrate.settings import Settings, parse_mesh, settings_for, settings_for_trace
from meshplan.calibrate.system import to_toml, write_system

__all__ = [
    "AttentionSample",
    "Calibration",
    "CollectiveSample",
    "GemmSample",
    "MemorySample",
    "MeshGuess",
    "PairSample",
    "Settings",
    "calibrate",
    "discover_mesh",
    "fit_attention",
    "fit_collectives",
    "fit_gemm",
    "fit_memory",
    "linear_fit",
    "pair_matrices",
    "parse_mesh",
    "settings_for",
    "settings_for_trace",
    "to_toml",
    "write_system",
]
