"""ServeSpace: what the serving search may choose, and the targets a configuration must meet.

Every tensor-parallel size (powers of two that divide the heads, up to ``max_tp``), pipeline depth, data-parallel
attention groups and expert placement (MoE), decode batch on a geometric grid, and every way of splitting the
instances into prefill and decode pools (or none); replicas fill the GPUs. The precision is the checkpoint's, 16 bits
(the model specs meshplan reads carry no quantisation), unless ``quants`` names the schemes to try (``QUANTS``: every
scheme, the command line's ``--quant all``): quantising changes the model served, which is the user's choice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from meshplan import ranges
from meshplan.errors import SpecError
from meshplan.serve.engine import DEFAULT as DEFAULT_ENGINE
from meshplan.serve.engine import Engine
from meshplan.serve.precision import Quant

# decode batches tried: a geometric grid of about 1.5x steps (1, 2, 3, 4, 6, 8, 12 …)
BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)
# every scheme (--quant all): 16 bits, W8A8 fp8 (16-bit and fp8 KV cache), W4A16 int4, W4A4 NVFP4 with fp8 KV
QUANTS = (Quant(), Quant(weights="fp8", activations="fp8"), Quant(weights="fp8", activations="fp8", kv_cache="fp8"),
          Quant(weights="int4"), Quant(weights="fp4", activations="fp4", kv_cache="fp8"))
RANKINGS = ("throughput", "latency")


@dataclass(frozen=True, kw_only=True)
class ServeSpace:
    """The choices and targets of a serving search."""

    input_len: int
    output_len: int
    cached_len: int = 0  # prompt tokens each request finds in the prefix cache (plan.Workload)
    quants: tuple[Quant, ...] = (Quant(),)  # the checkpoint's 16 bits (module docstring)
    batches: tuple[int, ...] = BATCHES
    max_tp: int = 64
    max_pp: int = 8
    tp: tuple[int, ...] = ()  # sizes to try (empty: every power of two up to max_tp / max_pp)
    pp: tuple[int, ...] = ()
    dpa: tuple[int, ...] = ()
    disaggregate: bool = True  # also try prefill / decode pools
    ttft_slo: float = 0.0  # seconds; 0: no target
    tpot_slo: float = 0.0
    engine: Engine = field(default=DEFAULT_ENGINE)
    rank_by: str = "throughput"  # output tokens/s of the deployment, or the lowest TPOT
    prefer_simple: bool = True  # within the serving error band of the best, the simplest first after it (search.py)
    simplest_leads: bool = False  # the simplest of that band leads instead of the best (search.py)

    def __post_init__(self) -> None:
        if not self.quants:
            raise SpecError("quant: no quantisation scheme to try")
        if self.rank_by not in RANKINGS:
            raise SpecError(f"rank={self.rank_by!r} must be one of {', '.join(RANKINGS)}")
        for name in ("ttft_slo", "tpot_slo"):
            ranges.check_value(name.replace("_", "-"), getattr(self, name), key="slo")
