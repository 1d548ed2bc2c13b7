"""The command line: the ``meshplan`` group, its commands (one module each) and the one-line error policy.

Commands of other packages join through the ``meshplan.commands`` entry point group (the validation layer's
``validate``): the core never imports them. Any bad input becomes one line on stderr and exit status 2.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
import threading
from collections.abc import Iterator
from importlib.metadata import entry_points
from typing import Any

import click

from meshplan.cli import check, report, tools
from meshplan.cli.estimate import estimate
from meshplan.cli.plan import plan_cmd
from meshplan.cli.rl import rl_cmd
from meshplan.cli.serve import serve_cmd
from meshplan.errors import MeshplanError
from meshplan.fields import one_line


class _PipeClosed(Exception):
    """stdout's reader has gone (BrokenPipeError), carried past click, which would exit 1 on it."""


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            raise _PipeClosed from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="meshplan")
def cli() -> None:
    """meshplan: how fast will this model train on this hardware, will it fit, and which plan is best."""


for command in [estimate, plan_cmd, serve_cmd, rl_cmd, *tools.COMMANDS, check.check_step_cmd, *report.COMMANDS]:
    cli.add_command(command)
for entry in entry_points(group="meshplan.commands"):
    cli.add_command(entry.load(), entry.name)


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI; any bad input becomes one line on stderr and exit status 2."""
    try:
        with _ctrl_c() as interrupted:
            cli.main(args=argv, prog_name="meshplan", standalone_mode=False)
            sys.stdout.flush()  # a closed pipe is found here, not at the interpreter's exit
        if interrupted:  # a KeyboardInterrupt that C code swallowed (NumPy's loops check signals and may clear it)
            raise KeyboardInterrupt
    except (BrokenPipeError, _PipeClosed):  # `meshplan … | head -1`: the reader has what it wanted
        return _closed_pipe()
    except MeshplanError as exc:
        return _error(str(exc))
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("meshplan: aborted", err=True)
        return 130
    except click.exceptions.NoArgsIsHelpError as exc:  # bare `meshplan`: the usage, as --help prints it
        click.echo(exc.ctx.get_help(), err=True)
        return 2
    except click.ClickException as exc:
        return _error(exc.format_message())
    except Exception as exc:  # noqa: BLE001  (a bug, not bad input: still one line, and how to see more)
        if os.environ.get("MESHPLAN_DEBUG"):
            raise
        if _out_of_memory(exc):  # what the command asked of this host's or GPU's memory: too much, not a bug
            return _error(f"out of memory: {type(exc).__name__}: {one_line(str(exc))[:200]} (this host or GPU has "
                          "less than the command asked for: smaller inputs, model, batch or fewer ranks)")
        first = one_line((str(exc).strip().splitlines() or [""])[0])
        click.echo(f"meshplan: internal error: {type(exc).__name__}: {first} (a bug in meshplan: please report "
                   "the command; MESHPLAN_DEBUG=1 shows the traceback)", err=True)
        return 3
    return 0


def _out_of_memory(exc: BaseException) -> bool:
    """An allocation the machine refused: Python's MemoryError, PyTorch's OutOfMemoryError (a GPU's) or the
    RuntimeError of its CPU allocator ("DefaultCPUAllocator: can't allocate memory")."""
    text = str(exc)
    return isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError" or (
        isinstance(exc, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text))


@contextlib.contextmanager
def _ctrl_c() -> Iterator[list[int]]:
    """Ctrl-C raises KeyboardInterrupt as Python's own handler does, and is remembered: a run interrupted is never
    exit status 0 (issue 48: late in `plan --all -o` the interrupt was lost inside NumPy and the run exited 0)."""
    seen: list[int] = []
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler or \
            threading.current_thread() is not threading.main_thread():
        yield seen  # someone else's handler (a test harness), or not the main thread: leave it
        return

    def handler(signum: int, frame: Any) -> None:
        seen.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# An error line longer than this is cut (with how much was left out): five lines of an 80-column terminal;
# the messages name a field, its value and the allowed range well within it, a list of every violation may not.
MAX_ERROR = 400


def _error(message: str) -> int:
    line = one_line(message)
    if len(line) > MAX_ERROR:
        line = f"{line[:MAX_ERROR]}… ({len(line) - MAX_ERROR:,} more characters)"
    click.echo(f"meshplan: error: {line}", err=True)
    return 2


def _closed_pipe() -> int:
    """Exit quietly when stdout's reader has gone: what is still buffered goes to /dev/null, not to a second
    BrokenPipeError at exit (the Python documentation's recipe, library/signal.html "Note on SIGPIPE")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):  # stdout without a descriptor (tests)
        os.dup2(devnull, sys.stdout.fileno())
    return 0


def run() -> None:
    """Console-script wrapper: exit with main()'s status."""
    sys.exit(main())
