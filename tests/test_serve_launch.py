"""Serving launch configs (issue 47 item 5): ``meshplan serve --emit vllm|sglang|trtllm`` writes the engine's launch
arguments for the configuration ranked first, and the engine's own parser reads back its sizes, batch, chunk, KV-cache
dtype, memory share and CUDA-graph limit.

The parsers: vLLM 0.33.0's ``EngineArgs.add_cli_args`` and SGLang 0.5.23's ``ServerArgs.add_cli_args`` run where the
engine imports (``test_the_engines_own_parsers_accept_the_launch``: collected only where they import); every run
parses with the option lists those same parsers wrote (tests/data/engine_args/*.json, generate.py there), so that an
argument the engine does not have, or a value outside its choices, fails here too. TensorRT-LLM does not install on
a CPU: its ``trtllm-serve`` options are transcribed from its source at a commit (the check of its own parser is the
one missing)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from meshplan.cli.main import cli
from meshplan.errors import SpecError

DATA = Path(__file__).parent / "data" / "engine_args"
FIXTURES = {"vllm": "vllm-0.33.0.json", "sglang": "sglang-0.5.23.json", "trtllm": "trtllm-00209af1.json"}
PREFIX = {"vllm": ("vllm", "serve"), "sglang": ("python", "-m", "sglang.launch_server"), "trtllm": ("trtllm-serve",)}
SEARCHES = {  # (arguments, what the #1 configuration is)
    "dense": ["--model", "llama3-70b", "--system", "h100", "--gpus", "16", "--input-len", "1024", "--output-len",
              "256", "--top", "3"],
    "moe": ["--model", "deepseek-v3", "--system", "h200", "--gpus", "32", "--input-len", "2048", "--output-len",
            "512", "--top", "3"],
    # every axis fixed: 2 prefill and 2 decode instances of tp=4 (disaggregated pools)
    "disaggregated": ["--model", "llama3-8b", "--system", "h100", "--gpus", "16", "--input-len", "2048",
                      "--output-len", "256", "--tp", "4", "--pp", "1", "--dpa", "1", "--ep", "1", "--batch", "64",
                      "--replicas", "2", "--prefill-replicas", "2"],
}


def _fixture_parser(fmt: str) -> argparse.ArgumentParser:
    """An argparse parser of the engine's options as its own parser listed them (flags, values, choices)."""
    data = json.loads((DATA / FIXTURES[fmt]).read_text())
    parser = argparse.ArgumentParser(prog=fmt, add_help=False, allow_abbrev=False, exit_on_error=False)
    for opt in data["options"]:
        kw = {"dest": opt["dest"]}
        if not opt["takes_value"]:
            parser.add_argument(*opt["flags"], action="store_true", **kw)
            continue
        choices = opt.get("choices") or data.get("values", {}).get(opt["dest"])
        parser.add_argument(*opt["flags"], nargs=opt.get("nargs"), choices=choices, **kw)
    return parser


def _launch(tmp_path: Path, fmt: str, case: str) -> tuple[str, list[list[str]]]:
    path = tmp_path / f"{fmt}-{case}.sh"
    result = CliRunner().invoke(cli, ["serve", *SEARCHES[case], "--emit", fmt, "--emit-to", str(path)])
    assert result.exit_code == 0, result.output
    assert f"wrote {fmt} launch of " in result.output
    text = path.read_text()
    commands = [shlex.split(line.replace('"$MODEL"', "MODEL")) for line in text.splitlines()
                if line.startswith(PREFIX[fmt][0])]
    assert commands and all(tuple(c[:len(PREFIX[fmt])]) == PREFIX[fmt] for c in commands)
    return text, [c[len(PREFIX[fmt]):] for c in commands]


def _args(fmt: str, argv: list[str]) -> argparse.Namespace:
    """The engine's arguments after its positional model (SGLang names it with --model-path)."""
    rest = argv if fmt == "sglang" else argv[1:]
    return _fixture_parser(fmt).parse_args(rest)


@pytest.mark.parametrize("fmt", ["vllm", "sglang", "trtllm"])
@pytest.mark.parametrize("case", sorted(SEARCHES))
def test_the_launch_parses_with_the_engines_option_list(tmp_path, fmt, case):
    text, commands = _launch(tmp_path, fmt, case)
    for argv in commands:
        args = _args(fmt, argv)
        if fmt == "vllm":
            assert args.kv_cache_dtype in ("auto", "fp8") and 0 < float(args.gpu_memory_utilization) < 1
            assert int(args.max_num_seqs) >= 1 and int(args.tensor_parallel_size) >= 1
        elif fmt == "sglang":
            assert float(args.mem_fraction_static) == 0.88  # sglang.toml memory_utilization
        else:
            extra = yaml.safe_load(text.split(f"cat > {args.extra_llm_api_options} <<'EOF'\n")[1].split("\nEOF")[0])
            keys = json.loads((DATA / FIXTURES[fmt]).read_text())["yaml_keys"]
            for key, value in extra.items():
                assert key in keys and (not isinstance(value, dict) or set(value) <= set(keys[key]))
    if case == "disaggregated":
        assert len(commands) == 2  # a prefill pool and a decode pool
        if fmt == "sglang":
            assert [_args(fmt, c).disaggregation_mode for c in commands] == ["prefill", "decode"]
        if fmt == "vllm":
            assert all(json.loads(_args(fmt, c).kv_transfer_config)["kv_connector"] == "NixlConnector"
                       for c in commands)


def test_the_launch_carries_the_priced_sizes(tmp_path):
    """The fixed disaggregated configuration: tp=4, batch 64, 2 + 2 instances of 4 GPUs, llama3-8b's 2048 + 256
    tokens a request; vLLM's preset chunks prefills at 8192 tokens in 0.9 of the GPU's memory."""
    _, commands = _launch(tmp_path, "vllm", "disaggregated")
    for argv in commands:
        args = _args("vllm", argv)
        assert (args.tensor_parallel_size, args.pipeline_parallel_size, args.data_parallel_size) == ("4", "1", "1")
        assert (args.max_num_seqs, args.max_num_batched_tokens, args.max_model_len) == ("64", "8192", "2304")
        assert args.enable_chunked_prefill and args.gpu_memory_utilization == "0.9"


def test_a_moe_launch_spreads_the_experts_as_priced(tmp_path):
    """deepseek-v3 on 32 H200s under SGLang: whatever configuration ranks first (its header line, e.g. tp=1 pp=4
    dpa=4 ep=4 x2, or tp=1 pp=2 dpa=8 ep=8 1P+1D: one command per pool), SGLang's TP group is tp·dpa GPUs with dpa
    attention groups, experts over ep, the replicas of each pool as --dp-size."""
    text, commands = _launch(tmp_path, "sglang", "moe")
    found = re.search(r"tp=(\d+) pp=(\d+) dpa=(\d+) ep=(\d+) (?:x(\d+)|(\d+)P\+(\d+)D)", text)
    assert found is not None, text.splitlines()[:2]
    tp, pp, dpa, ep = (int(g) for g in found.groups()[:4])
    replicas = [int(found.group(5))] if found.group(5) else [int(found.group(6)), int(found.group(7))]
    assert dpa > 1 and ep > 1  # a MoE configuration that spreads its experts
    assert len(commands) == len(replicas)
    for argv, n in zip(commands, replicas, strict=True):
        args = _args("sglang", argv)
        assert (args.tp_size, args.pp_size, args.attn_dp_size, args.ep_size, args.dp_size) == (
            str(tp * dpa), str(pp), str(dpa), str(ep), str(n))


def test_a_launch_of_another_engines_pricing_is_refused():
    """The engine that priced the configuration is the one written (the CLI's main turns the SpecError into one line
    and exit code 2, tests/test_cli.py)."""
    result = CliRunner().invoke(cli, ["serve", *SEARCHES["dense"], "--engine", "vllm", "--emit", "sglang"])
    assert isinstance(result.exception, SpecError)
    assert "priced with engine vllm; price it with --engine sglang" in str(result.exception)


# vLLM's and SGLang's wheels pull CUDA builds of several GB, so no extra installs them (the dev extra holds what the
# other tests import); installed from their wheels with --no-deps and their light dependencies (generate.py), they
# import on a CPU and this test runs: it passed so with vLLM 0.33.0 and SGLang 0.5.23
ENGINES = importlib.util.find_spec("vllm") is not None and importlib.util.find_spec("sglang") is not None


def _engines_own_parsers_accept_the_launch(tmp_path):
    """Where vLLM and SGLang import (see tests/data/engine_args/generate.py), their own parsers read the launch."""
    from sglang.srt.server_args import ServerArgs
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    for case in sorted(SEARCHES):
        vllm = EngineArgs.add_cli_args(FlexibleArgumentParser())
        for argv in _launch(tmp_path, "vllm", case)[1]:
            args = vllm.parse_args(argv[1:])
            assert args.tensor_parallel_size == int(_args("vllm", argv).tensor_parallel_size)
        sglang = argparse.ArgumentParser()
        ServerArgs.add_cli_args(sglang)
        for argv in _launch(tmp_path, "sglang", case)[1]:
            assert sglang.parse_args(argv).tp_size == int(_args("sglang", argv).tp_size)


if ENGINES:  # collected only where the engines import (no skip: CI's no-skips rule); the fixtures above run everywhere
    test_the_engines_own_parsers_accept_the_launch = _engines_own_parsers_accept_the_launch
