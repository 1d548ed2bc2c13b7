"""The traces of meshplan's presets kept on disk, so that planning a preset again skips PyTorch altogether.

Importing PyTorch and the fake-tensor machinery (FakeTensorMode imports torch._dynamo) and tracing a preset's step
take most of a ``plan --autoshard`` run (Llama-3-8B on 64 GPUs: about 3.5 of 9 CPU seconds, issue 83), and a preset's
trace is the same every time: the module is built from the preset's ModelSpec alone (torch_models.py) and traced
on fake tensors of the request's shapes. The trace (graph.Trace: flat records of ints, strings and tuples, no torch
object) is kept after the first run, under a key made of everything it is traced from: the ModelSpec (its repr,
every field), the traced layers, the inputs' shapes and dtypes, the parameters' dtype, the installed PyTorch's
version, and the source of every meshplan file that builds or traces the module. A change to any of them is a new
key (the old entry is not read again); a record that cannot be read is traced anew and written over.

Where: ``$MESHPLAN_CACHE`` (a folder; ``off`` keeps nothing), else ``$XDG_CACHE_HOME/meshplan``, else
``~/.cache/meshplan``; the traces in its ``traces/`` folder, one file per key (``pickle``, written to a temporary
file and renamed, so concurrent planners never read half a record). A folder that cannot be written only means the
next run traces again. The integer programs' optimal bases are kept in its ``bases/`` folder (highs.py).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import pickle
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import meshplan

# the files whose code decides a preset's trace: the modules (autoshard/torch_models.py), the capture (trace/), this
TRACED_BY = ("autoshard/torch_models.py", "autoshard/trace_cache.py", "trace/*.py")
RECORD_VERSION = 1  # the record's layout (a pickled graph.Trace)


def cache_dir() -> Path | None:
    """The cache's folder (module docstring), or None when ``MESHPLAN_CACHE=off``."""
    chosen = os.environ.get("MESHPLAN_CACHE", "")
    if chosen.lower() == "off":
        return None
    if chosen:
        return Path(chosen)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "meshplan"


def code_digest(patterns: Sequence[str] | None = None) -> bytes:
    """A digest of the source of meshplan's files that match ``patterns`` (``TRACED_BY`` where not given): each
    file's path and bytes."""
    root = Path(meshplan.__file__).parent
    h = hashlib.blake2b(digest_size=16)
    for pattern in patterns or TRACED_BY:
        for path in sorted(root.glob(pattern)):
            h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return h.digest()


def _torch_version() -> str:
    """The installed PyTorch's version, read from the ``torch/version.py`` its build writes (``__version__ = '...'``),
    without importing torch or importlib.metadata (a tenth of a second of the planner's start-up); "none" without
    torch, and the installed distribution's metadata where that file says nothing else."""
    spec = importlib.util.find_spec("torch")
    if spec is None:
        return "none"
    for folder in spec.submodule_search_locations or ():
        path = Path(folder) / "version.py"
        if path.is_file():
            found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", path.read_text(), re.MULTILINE)
            if found:
                return found.group(1)
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "none"


def preset_key(spec: Any, layers: int, inputs: Sequence[tuple[tuple[int, ...], str]], param_dtype: str | None) -> str:
    """The key of a preset's trace: a digest of everything it is traced from (module docstring)."""
    h = hashlib.blake2b(digest_size=20)
    for part in (str(RECORD_VERSION), repr(spec), str(layers), repr(tuple(inputs)), str(param_dtype), _torch_version()):
        h.update(part.encode() + b"\0")
    h.update(code_digest())
    return h.hexdigest()


def _path(key: str) -> Path | None:
    folder = cache_dir()
    return folder / "traces" / f"{key}.pickle" if folder is not None else None


def load_trace(key: str) -> Any | None:
    """The trace kept under ``key``, or None (none kept, the cache off, or a record that cannot be read)."""
    path = _path(key)
    if path is None or not path.is_file():
        return None
    from meshplan.trace.graph import Trace

    try:
        with path.open("rb") as f:
            found = pickle.load(f)  # noqa: S301  (meshplan's own record, in the user's own cache folder)
    except Exception:  # noqa: BLE001  (a truncated or foreign file: traced again and written over)
        return None
    return found if isinstance(found, Trace) else None


def save_trace(key: str, trace: Any) -> None:
    """Keep ``trace`` under ``key``; a folder that cannot be written keeps nothing (module docstring)."""
    path = _path(key)
    if path is None:
        return
    try:
        data = pickle.dumps(trace, protocol=pickle.HIGHEST_PROTOCOL)
    except pickle.PicklingError:
        return
    write_whole(path, data)


def write_whole(path: Path, data: bytes) -> None:
    """``data`` written to a temporary file beside ``path`` and renamed to it (a reader sees the old file or the whole
    new one); a folder that cannot be written keeps nothing. highs.py keeps its bases with it."""
    import tempfile  # noqa: PLC0415  (and its random and shutil: only a request that writes, not one that reads)

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".part")
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(temp, path)
    except OSError:
        Path(temp).unlink(missing_ok=True)
