"""The frameworks' own argument parsers that cannot be installed beside meshplan's pins, unpacked from their PyPI
wheels into .venv/framework-parsers/ for the tests that run them (tests/framework_parsers.py):

- megatron-lm: Megatron-LM's ``megatron/training`` (``parse_args``, ``validate_args``,
  ``core_transformer_config_from_args``) with the ``megatron/core`` of the same release. PyPI's megatron-core wheels
  ship ``megatron/training`` from 0.17.0 on (0.16.1's wheel and sdist hold ``megatron/core`` only) and need Python
  3.12, so the wheel is downloaded for 3.12 and its Python files unpacked here: they import and run on 3.11 (a
  subprocess puts them first on its path, so the dev extra's megatron-core 0.16.1 stays what the other tests use).
- megatron-bridge: Megatron-Bridge 0.3.1's Python files (its ConfigContainer and the configs it holds), read by the
  tests as source: its package imports Transformer Engine, a CUDA build, before anything else.
- engines: vLLM 0.33.0's ``EngineArgs.add_cli_args`` and SGLang 0.5.23's ``ServerArgs.add_cli_args``, the Python
  files of their wheels (vLLM's CUDA build is 336 MB, most of it kernels the parser never loads) with the few
  pure-Python packages their argument modules import, installed without dependencies (their pins would replace the
  dev extra's torch).

Usage: ``python .ci/parsers.py TARGET`` (install-extras.sh runs it). Idempotent: a stamp file holds the list below,
and a target whose stamp matches is left as it is.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

MEGATRON = "megatron-core==0.17.0"
# Megatron-Bridge's ConfigContainer and the configs it holds: its package imports Transformer Engine (a CUDA build)
# at once, so the tests read its dataclasses' fields from these files (tests/test_configs_megatron_bridge.py)
BRIDGE = "megatron-bridge==0.3.1"
ENGINES = ("vllm==0.33.0", "sglang==0.5.23")
# what vllm/engine/arg_utils.py and sglang/srt/server_args.py import beyond the dev extra (found by importing them)
ENGINE_DEPS = ("aiohappyeyeballs==2.7.1", "aiohttp==3.14.5", "aiosignal==1.4.0", "apache-tvm-ffi==0.1.15.post2",
               "cachetools==8.0.2", "cbor2==6.3.0", "fastapi==0.165.0", "frozenlist==1.8.0", "ipython==9.18.1",
               "llguidance==1.9.1", "msgspec==0.22.0", "multidict==7.2.1", "openai==3.57.0", "openai-harmony==0.0.8",
               "opentelemetry-api==1.45.2", "opentelemetry-sdk==1.45.2",
               "opentelemetry-semantic-conventions==0.66b2", "orjson==3.13.0", "partial-json-parser==0.2.1.1.post7",
               "prometheus-client==0.26.0", "propcache==0.5.4", "pybase64==1.5.1", "pyzmq==27.3.0", "sniffio==1.3.1",
               "starlette==1.10.0", "traitlets==5.16.1", "uvloop==0.23.0", "xgrammar==0.2.9", "yarl==1.25.1")
STAMP = "\n".join((MEGATRON, BRIDGE, *ENGINES, *ENGINE_DEPS)) + "\n"


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args, "--disable-pip-version-check", "-q"], check=True)


def _unpack_python(wheel: Path, target: Path, top: str) -> None:
    """The package ``top``'s Python files (and JSON data) of ``wheel`` into ``target``."""
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.startswith(f"{top}/") and name.endswith((".py", ".json")) and "/tests/" not in name:
                z.extract(name, target)


def _megatron(target: Path, tmp: Path) -> None:
    machine = {"x86_64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}.get(__import__("platform").machine(),
                                                                                "x86_64")
    _pip("download", "--no-deps", "--only-binary", ":all:", "--python-version", "3.12", "--implementation", "cp",
         "--platform", f"manylinux_2_28_{machine}", MEGATRON, "-d", str(tmp))
    (wheel,) = tmp.glob("megatron_core-*.whl")
    _unpack_python(wheel, target / "megatron-lm", "megatron")
    (target / "megatron-lm" / "VERSION").write_text(MEGATRON + "\n")


def _bridge(target: Path, tmp: Path) -> None:
    _pip("download", "--no-deps", "--only-binary", ":all:", BRIDGE, "-d", str(tmp))
    (wheel,) = tmp.glob("megatron_bridge-*.whl")
    _unpack_python(wheel, target / "megatron-bridge", "megatron")
    (target / "megatron-bridge" / "VERSION").write_text(BRIDGE + "\n")


def _engines(target: Path, tmp: Path) -> None:
    _pip("download", "--no-deps", *ENGINES, "-d", str(tmp))
    for wheel in tmp.glob("*.whl"):
        top = wheel.name.split("-")[0]
        if top in ("vllm", "sglang"):
            _unpack_python(wheel, target / "engines", top)
    _pip("install", "--no-deps", "--target", str(target / "engines"), *ENGINE_DEPS)


def main(target: Path) -> None:
    stamp = target / "STAMP"
    if stamp.is_file() and stamp.read_text() == STAMP:
        print(f"install-extras: framework parsers already in {target}", file=sys.stderr)
        return
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        print(f"install-extras: Megatron-LM's parser ({MEGATRON} wheel, 2 MB) into {target}", file=sys.stderr)
        _megatron(target, Path(tmp) / "megatron")
        print(f"install-extras: Megatron-Bridge's config classes ({BRIDGE} wheel, 2 MB)", file=sys.stderr)
        _bridge(target, Path(tmp) / "bridge")
        print(f"install-extras: vLLM's and SGLang's parsers ({', '.join(ENGINES)}: about 380 MB of wheels, "
              "their Python files kept)", file=sys.stderr)
        _engines(target, Path(tmp) / "engines")
    stamp.write_text(STAMP)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
