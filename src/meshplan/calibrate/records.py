"""What a microbenchmark measured: one frozen record per timed point, SI units (seconds, bytes, FLOP).

These are the only inputs of the fits (fit.py) and of mesh discovery (discover.py), so both are pure functions
that tests drive with synthetic records of known α and β. Sizes follow comm.py's glossary: ``nbytes`` is the
all-reduce buffer, the all-gather *output*, the reduce-scatter *input*, the bytes one rank sends in an
all-to-all, and the message of a send/recv.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.cost.attention import core_flops

MEMORY_OPS = ("copy", "add", "layernorm")
DIST_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")
# host dispatch (dispatch.py): three bare aten ops called from Python, and an nn.Module call of the linear
DISPATCH_OPS = ("add", "layer_norm", "linear")
MODULE_OP = "module"


@dataclass(frozen=True, kw_only=True)
class GemmSample:
    """One (m×k)·(k×n) matmul in ``precision`` (fp32, bf16, fp16) took ``seconds``."""

    m: int
    n: int
    k: int
    precision: str
    seconds: float

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k  # one multiply and one add per (i, j, l)


@dataclass(frozen=True, kw_only=True)
class AttentionSample:
    """One causal ``scaled_dot_product_attention`` forward of ``batch`` × ``heads`` × ``seq`` × ``head_dim``
    queries, keys and values in ``precision`` took ``seconds``."""

    batch: int
    heads: int
    seq: int
    head_dim: int
    precision: str
    seconds: float

    @property
    def flops(self) -> float:
        """The cost model's count (cost/attention.core_attention): the causal half of 2·T·s·A·(d + d) with T = b·s
        queries against s keys, i.e. 2·b·A·s²·d; a flash kernel skips the masked blocks."""
        return float(core_flops(self.batch * self.seq, self.seq, self.heads, self.head_dim, self.head_dim)) / 2


@dataclass(frozen=True, kw_only=True)
class MemorySample:
    """One memory-bound kernel (``copy``, ``add``, ``layernorm``) moved ``nbytes`` to and from memory."""

    op: str
    nbytes: float
    seconds: float


@dataclass(frozen=True, kw_only=True)
class CollectiveSample:
    """One collective of ``nbytes`` (comm.py convention) among ``group`` ranks along mesh dimension ``dim``;
    ``seconds`` is the slowest rank's time (all groups of the dimension ran at once)."""

    kind: str
    dim: int
    group: int
    nbytes: float
    seconds: float


@dataclass(frozen=True, kw_only=True)
class PairSample:
    """A one-way message of ``nbytes`` between ranks ``src`` and ``dst`` (half a ping-pong round trip)."""

    src: int
    dst: int
    nbytes: float
    seconds: float


@dataclass(frozen=True, kw_only=True)
class DispatchSample:
    """One eager PyTorch call ``op`` (DISPATCH_OPS, or MODULE_OP: an ``nn.Linear`` module call) doing ``work``
    (bytes moved for add and layer_norm, FLOPs for linear and module) took ``seconds`` of wall clock per call,
    timed over many back-to-back calls."""

    op: str
    work: float
    seconds: float
