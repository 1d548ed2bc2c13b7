"""What the commands share: the model and system options, batch defaults, counts and lists, the progress bar."""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, overload

import click

from meshplan.errors import SpecError
from meshplan.fields import MAX_SIZE
from meshplan.files import check_output
from meshplan.ranges import RANGES

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

MAX_TOKENS = RANGES["tokens"].high  # the bounds of a token budget, a price and a plan count: ranges.RANGES
MAX_PRICE = RANGES["price"].high
MAX_TOP = int(RANGES["top"].high)
DEFAULT_BATCH_TOKENS = 4 * 2**20  # default global batch ≈ 4M tokens (GPT-3: 3.2M; Llama 2: 4M)

# `plan --emit` (cli/emit.py, imported only when a plan is emitted): the plans a search keeps when none of those listed
# can be written in the format asked for (write_best's deeper search), the next ones of the same ranking down to this
# many; the stack preset whose plans a format's framework runs (the search's framework when --framework is not given);
# the formats --emit takes: configs.FORMATS's names, without importing the formats' modules at start-up (a plan that
# emits nothing never needs them; tests/test_configs.py checks the two agree)
EMIT_DEPTH = 200
EMIT_FRAMEWORK = {"megatron": "megatron-core", "torchtitan": "torchtitan", "deepspeed": "deepspeed",
                  "nemo": "megatron-bridge"}
EMIT_FORMATS = tuple(EMIT_FRAMEWORK)


def check_emit(fmt: str | None, path: str | None, as_json: bool) -> None:
    """Before the search: ``--emit-to`` needs ``--emit``; with ``--json`` the config goes to a file, not stdout; the
    file must be one that can be written (its folder exists, it is not a folder)."""
    if path is not None and fmt is None:
        raise SpecError(f"emit-to={path} needs --emit FORMAT")
    if fmt is not None and as_json and path is None:
        raise SpecError("--emit with --json needs --emit-to PATH (stdout holds the JSON)")
    if path is None:
        return
    check_output(path, "emit-to")  # a folder, a FIFO, a link loop, a name the OS refuses
    target = Path(path)
    folder = target.parent
    if not folder.is_dir():
        raise SpecError(f"emit-to={path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise SpecError(f"emit-to={path} cannot be written (permission denied)")


def default_global_batch(seq_length: int, dp: int, micro_batch: int) -> int:
    """≈ 4M tokens per step, rounded up to a whole number of dp × micro-batch sequences."""
    unit = dp * micro_batch
    return max(1, math.ceil(DEFAULT_BATCH_TOKENS / seq_length / unit)) * unit


@overload
def split_ints(text: str, field: str) -> list[int]: ...
@overload
def split_ints(text: str | None, field: str) -> list[int] | None: ...
def split_ints(text: str | None, field: str) -> list[int] | None:
    if text is None:
        return None
    items = [v.strip() for v in text.split(",")]
    try:
        values = [int(v) for v in items]
    except ValueError:
        raise SpecError(f"{field}={text!r} must be integers separated by commas") from None
    return values


common_model = [
    click.option("--model", "model_ref", required=True,
                 help="preset name, .toml file, HF config.json or Hub id org/name (local HF cache)"),
    click.option("--system", "system_ref", required=True, help="system preset (h100, gb200 …) or .toml file"),
    click.option("--seq", "seq", type=int, default=None,
                 help="sequence length (default: a preset's training length; 4096 for a config.json)"),
    click.option("--nvlink-domain", type=int, default=None, help="override the NVLink domain size"),
]


def apply(options):
    def deco(f):
        for opt in reversed(options):
            f = opt(f)
        return f
    return deco


def model_at(model_ref: str, seq: int | None):
    """The model of ``--model``, at ``--seq`` if given."""
    from meshplan.specs.model_load import load_model

    model = load_model(model_ref)
    if seq is not None:
        if not 0 < seq <= MAX_SIZE:
            raise SpecError(f"seq={seq} must be a positive integer up to {MAX_SIZE:,}")
        model = model.with_seq_length(seq)
    return model


def sequences(value: int | None, field: str) -> int | None:
    """A batch in sequences (``--global-batch``, ``--micro-batch``): positive and at most MAX_SIZE (the search
    enumerates its divisors)."""
    if value is not None and not 0 < value <= MAX_SIZE:
        raise SpecError(f"{field}={value} must be a positive integer up to {MAX_SIZE:,}")
    return value


def load_inputs(model_ref: str, system_ref: str, seq: int | None, nvlink_domain: int | None, gpus: int):
    """The model of ``--model`` (at ``--seq``) and ``gpus`` GPUs of ``--system`` (with ``--nvlink-domain``)."""
    return load_counts(model_ref, system_ref, seq, nvlink_domain, [gpus])[0]


def load_counts(model_ref: str, system_ref: str, seq: int | None, nvlink_domain: int | None, counts: list[int]):
    """``load_inputs`` for each GPU count of ``counts`` (a strong-scaling plan): the model and the system read once
    (~2 ms each time), a cluster of each count."""
    from meshplan.specs.hardware import load_system

    model = model_at(model_ref, seq)
    system = load_system(system_ref)
    overrides = {"nvlink_domain": nvlink_domain} if nvlink_domain is not None else {}
    return [(model, system.cluster(gpus, **overrides)) for gpus in counts]


# compiled by re on first use (its own cache): a command given no count compiles none (start-up, issue 83)
_COUNT = r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kMBGT]?)\s*$"
_COUNT_SCALE = {"": 1.0, "k": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def parse_count(text: str, field: str) -> float:
    """``15T``, ``1.5e12``, ``400B`` → a positive number (a count, not a quantity with units)."""
    match = re.match(_COUNT, text)
    value = float(match.group(1)) * _COUNT_SCALE[match.group(2)] if match else 0.0
    if not 1 <= value <= MAX_TOKENS:
        raise SpecError(f"{field}={text!r} is not a count from 1 to {MAX_TOKENS:g} like '15T', '400B' or '1.5e12'")
    if match and not match.group(2) and value < MIN_BARE_COUNT:  # '15' meant 15T, not 15 tokens
        raise SpecError(f"{field}={text!r} would be {value:g} tokens: give a unit ('{text.strip()}T' = {value:g} "
                        f"trillion, '{text.strip()}B' = billion) or the whole count (at least {MIN_BARE_COUNT:g})")
    return value


# A count without a unit below this is taken for a missing unit: a million tokens is a fraction of one step of the
# default ≈ 4M-token batch (DEFAULT_BATCH_TOKENS), no training budget
MIN_BARE_COUNT = 1e6


def check_max_plans(value: int) -> None:
    """``--max-plans`` (plan, report, sweep): a count of plans, 0 for no limit."""
    if value < 0:
        raise SpecError(f"max-plans={value} must be a count of plans (0: no limit)")


def choices(text: str, allowed: tuple[str, ...], field: str) -> tuple[str, ...]:
    values = tuple(v.strip() for v in text.split(","))
    if values == ("",):
        raise SpecError(f"{field} is empty")
    for v in values:
        if v not in allowed:
            raise SpecError(f"{field}={v!r} must be one of {', '.join(allowed)}")
    if not values:
        raise SpecError(f"{field} is empty")
    return values


class progress:
    """A progress bar on stderr for searches that take more than a moment (interactive terminals only)."""

    def __init__(self, quiet: bool):
        self.quiet = quiet or not sys.stderr.isatty()
        self.bar: Progress | None = None
        self.task: TaskID | None = None

    def __enter__(self):
        if self.quiet:
            return None
        from rich.progress import Progress

        self.bar = Progress(transient=True)
        self.bar.__enter__()
        self.task = self.bar.add_task("evaluating plans (jobs)", total=None)
        return self.update

    def update(self, done: int, total: int) -> None:
        assert self.bar is not None and self.task is not None  # __enter__ hands this out with the bar started
        self.bar.update(self.task, completed=done, total=total)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)
        return False


NOTE_AFTER = 2.0  # seconds of work before a command without a terminal says what it is doing


@contextlib.contextmanager
def _plain_note(what: str, after: float) -> Iterator[None]:
    """``meshplan: WHAT …`` on stderr after ``after`` seconds (0: at once), and the time taken at the end if it was
    said."""
    import threading
    import time

    start, said = time.monotonic(), threading.Event()

    def say() -> None:
        said.set()
        print(f"meshplan: {what} …", file=sys.stderr, flush=True)

    timer = threading.Timer(after, say) if after else None
    if timer is None:
        say()
    else:
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()
        if said.is_set():
            print(f"meshplan: {what}: {time.monotonic() - start:.1f} s", file=sys.stderr, flush=True)


@contextlib.contextmanager
def working(what: str, quiet: bool = False, animate: bool = True) -> Iterator[None]:
    """What a command does while it takes more than a moment (report, check-step, calibrate, the sharding planner):
    a spinner, ``what`` and the time elapsed on stderr, gone when it ends; none when ``quiet`` (--json). Where
    stderr is not a terminal (a pipe, a log file, CI), plain lines instead: ``meshplan: WHAT …`` once the work has
    taken ``NOTE_AFTER`` seconds, and how long it took when it ends (issue 80: serve under load, sweep and report
    ran for minutes without a word). ``animate`` False: no refresh thread (the line is drawn once, at once where
    stderr is no terminal), for work that forks processes (a thread holding a lock at fork time would leave it held
    in the child)."""
    if quiet:
        yield
        return
    if not sys.stderr.isatty():
        with _plain_note(what, NOTE_AFTER if animate else 0.0):
            yield
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn(what), TimeElapsedColumn(), console=Console(stderr=True),
                  transient=True, auto_refresh=animate) as bar:
        bar.add_task(what, total=None)
        bar.refresh()
        yield
