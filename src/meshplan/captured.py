"""Third-party output kept to one line: transformers, torch and other libraries print advice and warnings while they
build a model (through Python's streams, loggers whose handlers hold the streams they were made with, and C code
writing to the file descriptors), and a config they refuse printed 35 lines of it before meshplan's one line (issue
80). ``captured`` collects all of it for the block it guards: after a block that succeeds, one note on stderr names
who spoke, its first line and how many more; after one that fails, meshplan's own error line stands alone.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator


def _fd_redirect(target: int) -> list[tuple[int, int]]:
    """Descriptors 1 and 2 pointed at ``target``: (descriptor, its saved copy) for each that exists."""
    saved = []
    for fd in (1, 2):
        try:
            saved.append((fd, os.dup(fd)))
            os.dup2(target, fd)
        except OSError:
            continue
    return saved


@contextlib.contextmanager
def captured(who: str) -> Iterator[list[str]]:
    """Everything written to stdout and stderr inside the block, as its non-blank lines (the list yielded, filled
    when the block ends); then the one-line note (module docstring)."""
    import tempfile  # noqa: PLC0415  (and its random and shutil: for the block only, not every importer's start-up)

    lines: list[str] = []
    streams = io.StringIO()
    with tempfile.TemporaryFile() as tmp:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        saved = _fd_redirect(tmp.fileno())
        failed = True
        try:
            with contextlib.redirect_stdout(streams), contextlib.redirect_stderr(streams):
                yield lines
            failed = False
        finally:
            for fd, copy in saved:
                os.dup2(copy, fd)
                os.close(copy)
            tmp.seek(0)
            text = streams.getvalue() + tmp.read().decode("utf-8", errors="replace")
            lines[:] = [line.strip() for line in text.splitlines() if line.strip()]
            if lines and not failed:
                more = f" (and {len(lines) - 1} more line{'s' * (len(lines) > 2)})" if len(lines) > 1 else ""
                sys.stderr.write(f"meshplan: note: {who} said: {lines[0][:200]}{more}\n")
