"""A calibration's host cost per launched kernel as a stack TOML: a copy of a stack preset with ``host_dispatch``
set to what this host measured, loadable by ``--framework FILE`` (specs/stack.load_stack).

Why a stack file and not the system file (system.py): the seconds the host spends per kernel depend on the
software as much as on the CPU: the same host pays 10-20 µs per aten op in eager PyTorch, more under an older
Transformer Engine wrapper (TransformerEngine issue #2053: +60 µs per te.Linear on Grace) and next to nothing
per kernel under CUDA graphs (one launch per captured graph). The Stack spec holds that cost (``host_dispatch``,
one field read by every engine), so the measurement goes into a copy of the stack that runs the plan; the
hardware file keeps the accelerator's own per-kernel t₀ (``gemm_overhead`` / ``kernel_overhead``), which is the
GPU's launch and ramp, not the host's. What this host measures is eager PyTorch's cost per call (dispatch.py):
the figure for eager stacks; a fused or graphed base stack launches fewer kernels, which the stack's other fields
say, not this one.
"""

from __future__ import annotations

import json
import re
import tomllib
from importlib import resources
from pathlib import Path

from meshplan.calibrate.fit import host_dispatch
from meshplan.calibrate.run import Calibration
from meshplan.errors import SpecError
from meshplan.files import read_text, write_text
from meshplan.specs.stack import load_stack, stack_names

_KEY = re.compile(r"^\s*(name|host_dispatch)\s*=")


def preset_text(base: str) -> str:
    """The TOML text of stack preset ``base``, or of the .toml file it names."""
    if base.lower().endswith(".toml"):
        return read_text(base, "stack-base")
    if base not in stack_names():
        raise SpecError(f"stack-base={base!r} must be a stack preset ({', '.join(stack_names())}) or a .toml file")
    return (resources.files("meshplan") / "presets" / "stacks" / f"{base}.toml").read_text()


def stack_toml(cal: Calibration, base: str = "generic") -> str:
    """Stack preset ``base`` with ``host_dispatch`` (and its name) set from ``cal``'s dispatch fits; a refused fit
    is one SpecError line (fit.dispatch_problem)."""
    found = host_dispatch(cal.dispatch)
    text = preset_text(base)
    label = Path(base).stem if base.lower().endswith(".toml") else base
    fits = {f.op: f for f in cal.dispatch}
    detail = ", ".join(f"{op} {fits[op].overhead * 1e6:.3g}" for op in found.ops)
    head, tables = _split(text)
    kept = [line for line in head if not _KEY.match(line)]
    while kept and not kept[-1].strip():
        kept.pop()
    lines = [
        f"# {label} with host_dispatch measured on {cal.host} ({cal.device_name}) {cal.date} by meshplan calibrate",
        f"# (meshplan.calibrate.stackfile): the median t0 of the eager calls {detail} us;",
        f"# an nn.Module call adds {found.module * 1e6:.3g} us on top of its op (not a Stack field).",
        f"name = {json.dumps(f'{label}-calibrated')}",
        *kept,
        f"host_dispatch = {float(found.seconds)!r}  # s per launched kernel: {found.seconds * 1e6:.3g} us",
        *([""] if tables else []),
        *tables,
    ]
    out = "\n".join(lines).rstrip("\n") + "\n"
    tomllib.loads(out)  # a malformed base fails here, not when the file is read back
    return out


def _split(text: str) -> tuple[list[str], list[str]]:
    """The lines before the first table header (top-level keys) and the rest."""
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if line.lstrip().startswith("[")), len(lines))
    return lines[:first], lines[first:]


def write_stack(cal: Calibration, path: str | Path, base: str = "generic") -> Path:
    """Write stack_toml to ``path`` (a .toml) and read it back through load_stack."""
    path = Path(path)
    if path.suffix.lower() != ".toml":
        raise SpecError(f"stack-out={str(path)!r} must end in .toml (load_stack reads it back by that suffix)")
    written = write_text(path, stack_toml(cal, base), "stack-out")
    load_stack(str(written), "stack-out")
    return written
