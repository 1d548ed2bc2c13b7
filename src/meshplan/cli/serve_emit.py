"""``meshplan serve --emit vllm|sglang|trtllm [--emit-to FILE]``: the configuration ranked first (or the one priced,
with every axis fixed) as the engine's launch script (serve/launch.py)."""

from __future__ import annotations

from typing import Any

import click

from meshplan.errors import SpecError
from meshplan.files import write_text
from meshplan.serve.launch import LAUNCH_FORMATS, launch_text

# the engine preset a format's configuration is priced with when --engine is not given (trtllm-serve's default
# backend is PyTorch: tensorrt_llm/commands/serve.py --backend default "pytorch")
EMIT_ENGINE = {"vllm": "vllm", "sglang": "sglang", "trtllm": "trtllm-pytorch"}

emit_options = [
    click.option("--emit", "emit_format", type=click.Choice(sorted(LAUNCH_FORMATS)), default=None,
                 help="write the configuration ranked #1 as this engine's launch arguments (after the table)"),
    click.option("--emit-to", "emit_to", default=None, help="with --emit: the file to write the launch script to"),
]


def take_emit(options: dict[str, Any], engine_given: bool, as_json: bool) -> tuple[str | None, str | None]:
    """``--emit`` and ``--emit-to``, checked before the search; the engine preset set to the format's where
    ``--engine`` was not given."""
    from meshplan.cli.emit import check_emit

    fmt, path = options.pop("emit_format"), options.pop("emit_to")
    check_emit(fmt, path, as_json)
    if fmt is not None and not engine_given:
        options["engine_ref"] = EMIT_ENGINE[fmt]
    return fmt, path


def write_launch(est: Any, fmt: str, path: str | None, context: int) -> None:
    """The launch script of ``est`` (a ServeEstimate; None: no configuration fits), printed or written to ``path``."""
    if est is None:
        raise SpecError(f"--emit {fmt}: no configuration fits to write")
    text = launch_text(fmt, est, context)
    if path is None:
        click.echo(text, nl=False)
    else:
        write_text(path, text, "emit-to")
        click.echo(f"wrote {fmt} launch of {est.plan.describe()} to {path}", err=True)
