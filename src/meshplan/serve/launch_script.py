"""The launch script of a serving configuration (serve/launch.py's pools) as something to run: every instance on its
node, its GPUs (``CUDA_VISIBLE_DEVICES``) and its port, and the router that sends requests to the pools.

Placement: nodes of ``PER_NODE`` GPUs (8: DGX / HGX servers, as configs/common.node_split), instances in order,
prefill pool first; an instance of up to a node's GPUs on one node (the next free block of GPUs, a new node when
the block does not fit), a larger one on whole nodes of its own. The script runs on every node: ``NODE`` (0 …
nodes-1) picks that node's commands; the router runs on node 0. Addresses: ``NODE<k>_ADDR`` (127.0.0.1 on one
node). Ports: the router 8000, the serving instances 8100 + k, prefill 8100 + k and decode 8200 + k (the numbering of
vLLM's NixlConnector guide); each engine's ``--port`` option (vLLM ``vllm serve --port``, SGLang ``--port``,
``trtllm-serve --port``). Instances on one node that move KV caches each get their own NIXL side channel
(``VLLM_NIXL_SIDE_CHANNEL_PORT`` 5600 + k, as vLLM's NixlConnector guide sets it per instance).

Routers:

- vLLM: disaggregated pools behind vLLM's proxy of its NixlConnector guide
  (docs/features/nixl_connector_usage.md: ``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py --port
  --prefiller-hosts --prefiller-ports --decoder-hosts --decoder-ports``); replicas of a MoE instance (one command
  each) behind any HTTP load balancer, said in a comment.
- SGLang: sglang-router (``python -m sglang_router.launch_router``; ``--pd-disaggregation --prefill URL --decode URL``
  for disaggregated pools, ``--worker-urls`` for replicas: SGLang's docs, router and PD disaggregation).
- TensorRT-LLM: ``trtllm-serve disaggregated -c disagg.yaml`` with the context (prefill) and generation (decode)
  servers' URLs in the YAML (tensorrt_llm/commands/serve.py ``disaggregated``; its docs' disaggregated serving).
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass

PER_NODE = 8
ROUTER_PORT = 8000
_FIRST_PORT = {"serve": 8100, "prefill": 8100, "decode": 8200}
_NIXL_PORT = 5600


@dataclass(frozen=True)
class Placed:
    """One instance: its pool's role, its index in the pool, its first node and GPUs there (``nodes`` > 1: whole
    nodes from ``node`` on), its port."""

    role: str
    index: int
    node: int
    gpus: tuple[int, ...]
    nodes: int
    port: int


def place_instances(pools: list) -> list[Placed]:
    """Every instance of ``pools`` (serve/launch.Pool: role, count, gpus) on nodes of PER_NODE GPUs (module
    docstring)."""
    out: list[Placed] = []
    node, used = 0, 0
    for pool in pools:
        for i in range(pool.count):
            port = _FIRST_PORT[pool.role] + i
            if pool.gpus > PER_NODE:
                node, used = (node + 1, 0) if used else (node, 0)
                span = math.ceil(pool.gpus / PER_NODE)
                out.append(Placed(pool.role, i, node, tuple(range(PER_NODE)), span, port))
                node += span
                continue
            if used + pool.gpus > PER_NODE:
                node, used = node + 1, 0
            out.append(Placed(pool.role, i, node, tuple(range(used, used + pool.gpus)), 1, port))
            used += pool.gpus
    return out


def address(node: int, nodes: int) -> str:
    """A node's address as the script writes it: 127.0.0.1 on one node, else ``$NODE<k>_ADDR``."""
    return "127.0.0.1" if nodes == 1 else f"$NODE{node}_ADDR"


def node_count(placed: list[Placed]) -> int:
    return max(p.node + p.nodes for p in placed)


def command_lines(fmt: str, pool, placed: Placed, nodes: int, nixl: int | None) -> list[str]:
    """The lines that start one instance: a comment where it spans nodes, then its command in the background."""
    argv = [*pool.argv, "--port", str(placed.port)]
    if fmt == "sglang" and placed.role == "prefill":
        argv += ["--disaggregation-bootstrap-port", str(bootstrap_port(placed))]
    env = [f"CUDA_VISIBLE_DEVICES={','.join(map(str, placed.gpus))}"]
    env += [f"VLLM_NIXL_SIDE_CHANNEL_PORT={nixl}"] if nixl is not None else []
    words = " ".join('"$MODEL"' if a == "$MODEL" else shlex.quote(a) for a in argv)
    lines = []
    if placed.nodes > 1:
        lines.append(f"  # spans nodes {placed.node}-{placed.node + placed.nodes - 1}: start it with the engine's "
                     "multi-node launch (vLLM on a Ray cluster, SGLang --nnodes / --node-rank, trtllm-serve under "
                     "mpirun); this is its first node's command")
    lines.append(f"  {' '.join(env)} {words} &")
    return lines


def router_lines(fmt: str, placed: list[Placed], disaggregated: bool) -> tuple[list[str], list[str]]:
    """The router (module docstring): the files it reads (written on every node, before the nodes' commands) and its
    command on node 0, or a comment where one command holds every replica."""
    nodes = node_count(placed)
    urls = {role: [f"http://{address(p.node, nodes)}:{p.port}" for p in placed if p.role == role]
            for role in ("serve", "prefill", "decode")}
    if not disaggregated:
        if len(urls["serve"]) == 1:
            return [], [f"# requests go to {urls['serve'][0]} (one command serves every replica)"]
        if fmt != "sglang":
            return [], [f"# requests: spread them over {' '.join(urls['serve'])} (any HTTP load balancer)"]
    if fmt == "vllm":
        hosts = {role: [p for p in placed if p.role == role] for role in ("prefill", "decode")}
        args = ["python", "tests/v1/kv_connector/nixl_integration/toy_proxy_server.py", "--port", str(ROUTER_PORT)]
        for role, flag in (("prefill", "prefiller"), ("decode", "decoder")):
            args += [f"--{flag}-hosts", *(address(p.node, nodes) for p in hosts[role])]
            args += [f"--{flag}-ports", *(str(p.port) for p in hosts[role])]
        return [], ["# the router (vLLM's NixlConnector proxy, from vLLM's source tree), on node 0:",
                    " ".join(args) + " &"]
    if fmt == "sglang":
        args = ["python", "-m", "sglang_router.launch_router", "--host", "0.0.0.0", "--port", str(ROUTER_PORT)]
        if disaggregated:  # a prefill server's URL, then its KV bootstrap port (bootstrap_port)
            args += ["--pd-disaggregation"]
            args += [w for p in placed if p.role == "prefill"
                     for w in ("--prefill", f"http://{address(p.node, nodes)}:{p.port}", str(bootstrap_port(p)))]
            args += [w for u in urls["decode"] for w in ("--decode", u)]
        else:
            args += ["--worker-urls", *urls["serve"]]
        return [], ["# the router (sglang-router), on node 0:", " ".join(args) + " &"]
    yaml = ["hostname: 0.0.0.0", f"port: {ROUTER_PORT}", "backend: pytorch"]
    for role, key in (("prefill", "context_servers"), ("decode", "generation_servers")):
        yaml += [f"{key}:", f"  num_instances: {len(urls[role])}", "  urls:",
                 *(f"    - \"{u.removeprefix('http://')}\"" for u in urls[role])]
    return (["cat > disagg.yaml <<EOF", *yaml, "EOF"],
            ["# the router (trtllm-serve disaggregated), on node 0:", "trtllm-serve disaggregated -c disagg.yaml &"])


def bootstrap_port(p: Placed) -> int:
    """SGLang's KV bootstrap port of a prefill instance (--disaggregation-bootstrap-port, 8998 by default): one per
    instance of a node, 8998 + its GPUs' first index (distinct on the node)."""
    return _BOOTSTRAP + p.gpus[0]


_BOOTSTRAP = 8998
