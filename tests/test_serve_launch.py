"""Serving launch configs (issue 47 item 5, issue 80): ``meshplan serve --emit vllm|sglang|trtllm`` writes the engine's
launch arguments for the configuration ranked first, one command per instance on its node's GPUs and port, and the
router in front; the engine's own parser reads back its sizes, batch, chunk, KV-cache dtype, memory share and
CUDA-graph limit.

The parsers: vLLM 0.33.0's ``vllm serve`` parser (``make_arg_parser``) and SGLang 0.5.23's
``ServerArgs.add_cli_args``, from their PyPI wheels' Python files (.ci/parsers.py; tests/engine_parsers_check.py runs
them in a subprocess); every run also parses with the option lists those same parsers wrote
(tests/data/engine_args/*.json, generate.py there). TensorRT-LLM does not install from PyPI (a placeholder sdist): its
``trtllm-serve``'s options are transcribed from its source at a commit (the check of its own parser is the one
missing). The script runs under bash on each node with the engines replaced by recorders: the GPUs and ports each
instance gets, and what the router is told."""

from __future__ import annotations

import argparse
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from framework_parsers import engine_parsers
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
    commands = []
    for line in text.splitlines():  # an instance: `  VAR=… ENGINE … &` (a router line runs another program)
        words = shlex.split(line.replace('"$MODEL"', "MODEL"))
        while words and "=" in words[0] and not words[0].startswith("-"):
            words = words[1:]
        if tuple(words[:len(PREFIX[fmt])]) == PREFIX[fmt] and words[len(PREFIX[fmt])] != "disaggregated":
            commands.append(words[len(PREFIX[fmt]):-1] if words[-1] == "&" else words[len(PREFIX[fmt]):])
    assert commands
    return text, commands


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
        assert len(commands) == 4  # two instances of the prefill pool, then two of the decode pool
        if fmt == "sglang":
            assert [_args(fmt, c).disaggregation_mode for c in commands] == ["prefill"] * 2 + ["decode"] * 2
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


def test_the_engines_own_parsers_accept_the_launch(tmp_path):
    """vLLM 0.33.0's ``vllm serve`` parser and SGLang 0.5.23's ``ServerArgs.add_cli_args`` (their PyPI wheels'
    Python files, .ci/parsers.py) read every command of every case, with the values meshplan wrote; an argument they
    do not have fails here (the last command)."""
    runs, expected = [], []
    for fmt in ("vllm", "sglang"):
        for case in sorted(SEARCHES):
            for argv in _launch(tmp_path, fmt, case)[1]:
                runs.append((fmt, argv))
                expected.append(_args(fmt, argv))
    runs.append(("vllm", ["MODEL", "--virtual-pipeline-size", "2"]))
    verdicts = engine_parsers(runs)
    assert not verdicts[-1]["ok"] and "unrecognized arguments" in verdicts[-1]["error"]
    for (fmt, argv), verdict, listed in zip(runs, verdicts, expected, strict=False):
        assert verdict["ok"], (fmt, argv, verdict)
        got = verdict["args"]
        if fmt == "vllm":
            assert got["tensor_parallel_size"] == int(listed.tensor_parallel_size)
            assert got["max_num_seqs"] == int(listed.max_num_seqs) and got["port"] == int(listed.port)
        else:
            assert got["tp_size"] == int(listed.tp_size) and got["port"] == int(listed.port)
            assert got["mem_fraction_static"] == float(listed.mem_fraction_static)


@pytest.mark.parametrize("fmt", ["vllm", "sglang", "trtllm"])
def test_each_instance_has_its_gpus_its_port_and_a_router(tmp_path, fmt):
    """The disaggregated case (2 prefill + 2 decode instances of tp=4 on 16 H100s), run with bash on each of its
    two nodes, every engine and router replaced by a recorder: each node starts two instances on disjoint GPU sets
    of 4 and distinct ports, and node 0 starts the router, which names every instance's address and port."""
    from framework_parsers import bash_launch

    path = tmp_path / f"{fmt}.sh"
    result = CliRunner().invoke(cli, ["serve", *SEARCHES["disaggregated"], "--emit", fmt, "--emit-to", str(path)])
    assert result.exit_code == 0, result.output
    programs = {"vllm": ("vllm", "python"), "sglang": ("python",), "trtllm": ("trtllm-serve",)}[fmt]
    addresses = {"NODE0_ADDR": "10.0.0.1", "NODE1_ADDR": "10.0.0.2"}
    ports, routers = [], []
    for node in (0, 1):
        runs = bash_launch(path, programs, env={"MODEL": "/ckpt", "NODE": str(node), **addresses})
        engines = [(argv, env) for argv, env in runs if "router" not in " ".join(argv[:3])
                   and "toy_proxy_server" not in " ".join(argv[:2]) and "disaggregated" not in argv[:2]]
        routers += [argv for argv, _ in runs if (argv, _) not in engines]
        gpus = [env["CUDA_VISIBLE_DEVICES"] for _, env in engines]
        assert sorted(gpus) == ["0,1,2,3", "4,5,6,7"], (node, gpus)
        ports += [(addresses[f"NODE{node}_ADDR"], argv[argv.index("--port") + 1]) for argv, _ in engines]
        if fmt == "vllm":
            assert sorted(env["VLLM_NIXL_SIDE_CHANNEL_PORT"] for _, env in engines) == ["5600", "5601"]
    assert len(set(ports)) == 4 and len(routers) == 1, (ports, routers)
    router = " ".join(routers[0])
    if fmt == "trtllm":
        router = (tmp_path / "disagg.yaml").read_text()
    for host, port in ports:
        assert host in router and port in router, (host, port, router)
