"""The command line: the ``meshplan`` group, its commands (one module each) and the one-line error policy.

Commands of other packages join through the ``meshplan.commands`` entry point group (the validation layer's
``validate``): the core never imports them. Each command is imported when it is used (cli/lazy.py), so that a
command loads only what it needs. Any bad input becomes one line on stderr and exit status 2.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import io
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

import click

from meshplan import interrupt
from meshplan.cli.lazy import Commands, Lazy
from meshplan.errors import MeshplanError
from meshplan.interrupt import by_interrupt

# Every command of the core, imported when it runs (or its own --help is asked for): name, module, attribute and the
# first paragraph of its help, which `meshplan --help` lists without importing the command (pip's commands_dict
# keeps the same table; tests/test_startup.py checks each summary against its command's help).
COMMANDS = [
    Lazy("calibrate", "meshplan.cli.tools", "calibrate_cmd", "Time GEMMs, memory-bound kernels and collectives on "
         "this host with PyTorch and fit meshplan's constants."),
    Lazy("check-step", "meshplan.cli.check", "check_step_cmd", "Predict one training step of MODEL (MODULE:FACTORY; "
         "or, with the research package meshplan_research, a zoo name: gpt2 llama mistral qwen-moe bert t5 vit "
         "resnet50 convnext mlp-mixer) on this machine, run it for real and compare: step time, peak memory, per op "
         "class and the largest discrepancies."),
    Lazy("estimate", "meshplan.cli.estimate", "estimate", "Estimate one training step of MODEL on GPUS accelerators "
         "of SYSTEM under one parallel plan."),
    Lazy("plan", "meshplan.cli.plan", "plan_cmd", "Search every parallel plan of MODEL on GPUS accelerators of "
         "SYSTEM and rank the feasible ones; with a MODULE:FACTORY model (or --autoshard), shard it op by op with "
         "the sharding planner instead."),
    Lazy("presets", "meshplan.cli.tools", "presets", "List the built-in model, system and framework presets, "
         "one a row with their sizes (plain columns: they read in a pipe, grep and sort as well as on a terminal)."),
    Lazy("report", "meshplan.cli.report", "report", "Search the plans of MODEL on GPUS accelerators of SYSTEM and "
         "write one self-contained HTML report: best plans, the plan space (every plan scored, its Pareto front), "
         "two plans compared, the trust panel, step-time and memory breakdowns, pipeline timeline, per-op roofline "
         "and scaling curves."),
    Lazy("rl", "meshplan.cli.rl", "rl_cmd", "Plan RL post-training (rollout, reference, reward, trainer, weight sync) "
         "of MODEL on GPUS accelerators of SYSTEM: colocated, split and asynchronous set-ups, each side's layout "
         "searched."),
    Lazy("serve", "meshplan.cli.serve", "serve_cmd", "Find the best way to serve MODEL on GPUS accelerators of "
         "SYSTEM for requests of INPUT-LEN / OUTPUT-LEN tokens under the TTFT and TPOT targets."),
    Lazy("sweep", "meshplan.cli.report", "sweep", "Best-plan throughput of MODEL over GPU counts × systems × "
         "NVLink sizes (strong scaling) or over a hardware parameter's scale factors; writes CSV / JSON (pandas "
         "reads them) and PNG / SVG pictures (none with --format none)."),
    Lazy("trace", "meshplan.cli.tools", "trace_cmd", "Trace a PyTorch model (MODULE:FACTORY or file.py:FACTORY "
         "returns an nn.Module) on fake tensors: per-op time on one GPU of SYSTEM, FLOPs and the liveness peak memory "
         "of one forward + backward pass."),
]


# The console script imports with the cyclic garbage collector off (cli/__init__.py): `meshplan plan`'s start-up makes
# some 47,000 tracked objects, nearly all kept for the process's life, and 90 collections passing over them again and
# again took about 4 % of its time (25 ms). Once the command is imported, what start-up made is frozen (gc.freeze:
# later collections pass it by) and the collector is on again for the command's own work (37 collections, 10 ms).
STARTUP = {"collector held": False, "console script": False}

# OpenBLAS starts a pool of threads, one per core, when NumPy loads: about 20 ms of CPU on a 2-core host (`import numpy`
# 129 -> 108 ms, the least of 15), more with more cores. These commands make no BLAS call (no matmul, dot or linalg in
# what they run: NumPy's element-wise arrays alone), so their console script asks OpenBLAS for one thread, unless the
# user chose a number (OpenBLAS reads these three, in this order: driver/others/openblas_env.c); check-step,
# calibrate and trace, which may run PyTorch on this host's CPU, keep the default.
BLAS_FREE = frozenset({"plan", "estimate", "serve", "presets", "report", "sweep", "rl"})
BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")

# glibc serves a block of 128 KiB or more from a fresh mapping and unmaps it when freed (mallopt(3): M_MMAP_THRESHOLD,
# raised only as such blocks are freed), and gives the heap's top back above 128 KiB (M_TRIM_THRESHOLD): the search's
# arrays, megabytes made and freed per chunk, were faulted in again page by page (DeepSeek-V3's plan: about 130,000
# minor faults and 0.2 s of system time over its processes; 95,000 with the heap kept). The same commands' console
# script keeps its heap: blocks up to 32 MiB (the largest threshold glibc allows on 64-bit hosts, malloc/malloc.c
# DEFAULT_MMAP_THRESHOLD_MAX) from it and its top kept, unless the user set glibc's MALLOC_* or malloc tunables. NumPy
# imports ctypes for these commands anyway.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
HEAP_KEPT = {M_MMAP_THRESHOLD: 32 << 20, M_TRIM_THRESHOLD: 1 << 30}


def _keep_heap() -> None:
    """The process's heap kept (HEAP_KEPT) on a host whose C library has glibc's mallopt; elsewhere nothing."""
    if sys.platform != "linux" or any(name.startswith("MALLOC_") for name in os.environ) or \
            "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return
    import ctypes  # noqa: PLC0415  (these commands' NumPy imports it)

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    for option, value in HEAP_KEPT.items():
        mallopt(option, value)


class _PipeClosed(Exception):
    """stdout's reader has gone (BrokenPipeError), carried past click, which would exit 1 on it."""


class _Group(click.Group):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands: Commands = Commands(COMMANDS, plugins="meshplan.commands")

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            raise _PipeClosed from None

    def resolve_command(self, ctx: click.Context,
                        args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        script = STARTUP["collector held"]  # the console script, its command not yet imported
        if script:
            from meshplan.cli.codecache import INSTALLED, install_presets  # noqa: PLC0415  (its presets parsed once)

            install_presets()
            if args and "methods" in INSTALLED and args[0] in self.commands and args[0].replace("-", "").isalnum():
                INSTALLED["methods"].for_command(args[0])  # its dataclasses' methods in a file of its own
            if args and args[0] in BLAS_FREE:
                _keep_heap()
                if "numpy" not in sys.modules and not any(os.environ.get(name) for name in BLAS_THREADS):
                    os.environ["OPENBLAS_NUM_THREADS"] = "1"
        found = super().resolve_command(ctx, args)
        if script:  # the command is imported: start-up is over (STARTUP)
            STARTUP["collector held"] = False
            gc.freeze()
            gc.enable()
        return found

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's listing, of each command as listed (a stand-in with its summary until it is imported)."""
        with self.commands.listing():
            super().format_commands(ctx, formatter)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="meshplan")
def cli() -> None:
    """meshplan: how fast will this model train on this hardware, will it fit, and which plan is best."""


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI; any bad input becomes one line on stderr and exit status 2."""
    interrupted: list[int] = []
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
        if by_interrupt(exc) or interrupted:  # an import or C call that Ctrl-C broke: still an interrupt
            click.echo("meshplan: aborted", err=True)
            return 130
        if os.environ.get("MESHPLAN_DEBUG"):
            raise
        from meshplan.fields import one_line  # noqa: PLC0415  (its dataclasses: not for `meshplan --help`)

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
    seen: list[int] = interrupt.SEEN if signal.getsignal(signal.SIGINT) is interrupt.handler else []
    if signal.getsignal(signal.SIGINT) not in (signal.default_int_handler, interrupt.handler) or \
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
    from meshplan.fields import one_line  # noqa: PLC0415  (its dataclasses: not for `meshplan --help`)

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
    """Console-script wrapper: exit with main()'s status; a second Ctrl-C while main() answers the first is the same
    one line and exit 130 (meshplan/interrupt.py covers the imports before it)."""
    try:
        code = main()
    except KeyboardInterrupt:
        click.echo("meshplan: aborted", err=True)
        code = 130
    # the interpreter's last collections would pass over all the command made, to free cycles the process's end frees
    # anyway (plan --autoshard: about 0.05 s of CPU): frozen, they are passed by; atexit's functions still run. Only
    # in the console script's own process: a caller of run() that catches SystemExit keeps its collector whole
    if STARTUP["console script"]:
        gc.freeze()
        _exit_now(code)
    sys.exit(code)


def _exit_now(code: object) -> None:
    """The console script's end without the interpreter's teardown: the output flushed and atexit's functions run
    (the dataclass methods' and presets' files, multiprocessing's and logging's own), then ``os._exit``, as
    Instagram's servers skip the teardown ("Dismissing Python Garbage Collection at Instagram", 2017: atexit then
    os._exit). The teardown frees every object one by one, which the process's end does at once (plan --autoshard,
    a first request: 0.03 to 0.05 s of CPU; the quick start about 0.015 s). Where a thread not a daemon still runs
    (the interpreter would wait for it), the status is not an int (sys.exit prints it), or the output cannot be
    flushed (a reader gone: the interpreter's own exit handles it as before), the interpreter's exit instead."""
    if not isinstance(code, int) or any(t.is_alive() and not t.daemon for t in threading.enumerate()
                                        if t is not threading.main_thread()):
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    atexit._run_exitfuncs()  # what the interpreter's exit runs first (an error in one is printed, the rest still run)
    with contextlib.suppress(OSError, ValueError):  # what they printed
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code & 0xFF)
