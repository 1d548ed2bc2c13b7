"""Ctrl-C before the command line runs: the ``meshplan`` console script imports the whole package (NumPy, click, the
commands) before ``cli.main`` can catch an interrupt, and a Ctrl-C there printed a KeyboardInterrupt traceback
(issue 80: 2 of 3 tries during `plan --all -o`'s imports). Imported first by ``meshplan/__init__.py`` (which sets a
two-line hook of the same kind before it imports this module). In the console script only (``sys.argv[0]`` is the
``meshplan`` script; a program that imports meshplan keeps Python's own behaviour), an interrupt that reaches the
interpreter's top level prints ``meshplan: aborted`` instead of the traceback, and the process exits with status 130
(128 + SIGINT), as for an error an interrupt caused (``by_interrupt``, ``SEEN``). ``cli.main`` handles every
interrupt once it runs (exit 130, the same line); forked search workers ignore SIGINT (search/workers.py), so that
only the parent answers it. Not reached: the first tens of milliseconds, while the interpreter starts and pip's
console-script wrapper imports ``re``, before any of meshplan's code runs (the exit status is still SIGINT's).
"""

from __future__ import annotations

import os
import signal
import sys
from types import TracebackType


def by_interrupt(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a KeyboardInterrupt or was raised while one was handled: an extension module interrupted
    while it imports (NumPy's C import turns the interrupt into an ImportError about a "bad install")."""
    seen = 0
    while exc is not None and seen < 20:
        if isinstance(exc, KeyboardInterrupt):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


SEEN: list[int] = []  # the SIGINTs this process received (the console script's handler below records them)


def handler(signum: int, frame: object) -> None:
    """Python's own reaction to Ctrl-C (KeyboardInterrupt), remembered: C code that swallows the exception (an
    extension module's import) cannot hide that the run was interrupted."""
    SEEN.append(signum)
    raise KeyboardInterrupt


def _quiet_interrupt(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    if SEEN or by_interrupt(value):
        sys.stderr.write("meshplan: aborted\n")
        sys.stderr.flush()
        os._exit(130)
    sys.__excepthook__(kind, value, tb)


def _quiet_unraisable(unraisable: sys.UnraisableHookArgs) -> None:
    """An interrupt raised where Python cannot propagate it (a weakref callback: importlib's module-lock ``cb`` when
    Ctrl-C lands mid-import) is printed as "Exception ignored in ..." with a traceback. It is already in ``SEEN``, and
    ``cli.main`` answers it with its one line and exit 130; anything else is printed as Python prints it."""
    if not by_interrupt(unraisable.exc_value):
        sys.__unraisablehook__(unraisable)


if os.path.basename(sys.argv[0] if sys.argv else "") == "meshplan" and \
        signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    sys.excepthook = _quiet_interrupt
    sys.unraisablehook = _quiet_unraisable
    signal.signal(signal.SIGINT, handler)
