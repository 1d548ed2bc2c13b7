"""vLLM V1's host time per decode iteration against the sequences it runs, measured on this CPU in vLLM's own code, as
benchmarks/measure/vllm_v0_host_cpu.py measures V0's (its docstring: the method, the scaling to the reference host, what
is left out).

V1 splits the engine (vllm/v1/engine/core.py ``EngineCore.step``: ``Scheduler.schedule``, the executor's
``GPUModelRunner.execute_model``, ``Scheduler.update_from_output``) from tokenisation, detokenisation and streaming,
which run in other processes beside it (the frontend's ``OutputProcessor``); so the engine core's step is the host
time the GPU waits on, and nothing of it runs beside the GPU (before ``--async-scheduling``, opt-in in 0.10). Here
``EngineCore.step`` runs as vLLM 0.10.0 ships it, with an executor that holds the model runner (vLLM's own CPU
subclass of ``GPUModelRunner``: its input preparation, attention metadata (the FLASH_ATTN builder, an NVIDIA GPU's),
sampler and bookkeeping; device tensors are its CPU tensors, so the few host-to-device copies are not timed) and a
stand-in model whose forward pass returns zeros and whose logits span a 256-token vocabulary (``hf_overrides``); the KV
cache's pages are accounted for, not allocated. Prefix caching off, as benchmark_latency.py turns it off from v0.9.

Bypassed for the CPU: the platform answers as an H100 would (capability 9.0, no pinned memory), the CUDA kernels'
module and capability probes, and flash-attn's package, as stubs that raise if called; distributed groups over gloo.
Run in a virtual environment with torch 2.13 CPU and vLLM 0.10.0's pure-Python dependencies (numba among them):

    pip download vllm==0.10.0 --no-deps -d /tmp/w && python -m zipfile -e /tmp/w/vllm-*.whl /tmp/v0100
    python benchmarks/measure/vllm_v1_host_cpu.py --vllm /tmp/v0100 --model /tmp/llama-shape \\
        --out data/measured/2026-11-27-vllm-host-cpu.json
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_v0_host_cpu import PROMPT, STEPS, TINY, WARM, module_call, record, sweep, timed_steps, unpacked  # noqa: E402

LAYERS, KV_HEADS, HEAD, HIDDEN, BLOCKS = 32, 8, 128, 4096, 4096  # Llama-3-8B's KV shape; pages for 256 sequences


def _bypass() -> None:
    """vLLM's CUDA-only pieces, bypassed (module docstring)."""
    import vllm.platforms as platforms

    sys.modules["vllm._C"] = types.ModuleType("vllm._C")

    def no_gpu(*args: object, **kwargs: object) -> None:
        raise RuntimeError("no GPU kernel runs in the host benchmark")

    for name in ("vllm.vllm_flash_attn", "vllm.vllm_flash_attn.layers", "vllm.vllm_flash_attn.layers.rotary"):
        stub = types.ModuleType(name)
        stub.__path__ = []  # type: ignore[attr-defined]
        stub.flash_attn_varlen_func = stub.get_scheduler_metadata = stub.apply_rotary_emb = no_gpu  # type: ignore[attr-defined]
        sys.modules[name] = stub
    from vllm.platforms.cuda import NonNvmlCudaPlatform
    from vllm.platforms.interface import DeviceCapability

    class Hopper(NonNvmlCudaPlatform):  # what the engine asks an H100, answered without one
        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
            return DeviceCapability(9, 0)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return "NVIDIA H100 80GB HBM3"

        @classmethod
        def is_fully_connected(cls, ids: list[int]) -> bool:
            return True

        @classmethod
        def is_pin_memory_available(cls) -> bool:
            return False

    platforms._current_platform = Hopper()
    import vllm._custom_ops as ops

    for name in dir(ops):  # the CUDA kernels' capability probes, asked at import
        if name.startswith("cutlass_") and "support" in name:
            setattr(ops, name, lambda *a, **k: False)
    import vllm.attention.utils.fa_utils as fa

    fa.get_flash_attn_version = lambda *a, **k: 2
    import vllm.v1.worker.gpu_model_runner as runner
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

    runner.get_attn_backend = lambda *a, **k: FlashAttentionBackend


def _executor():  # noqa: ANN202
    """The executor that holds the model runner and a stand-in model (module docstring)."""
    import torch
    from vllm.v1.executor.abstract import Executor
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    class StandIn(torch.nn.Module):
        def forward(self, input_ids=None, positions=None, intermediate_tensors=None,  # noqa: ANN001, ANN202
                    inputs_embeds=None, **kwargs):  # noqa: ANN001, ANN003
            return torch.zeros(positions.shape[0], HIDDEN, dtype=torch.bfloat16)

        def compute_logits(self, hidden, metadata):  # noqa: ANN001, ANN202
            return torch.randn(hidden.shape[0], TINY)

    class Runner(CPUModelRunner):
        def load_model(self, eep_scale_up: bool = False) -> None:
            self.model = StandIn()

        def initialize_kv_cache_tensors(self, config):  # noqa: ANN001, ANN202
            return {}  # attention never runs: pages accounted for, not allocated

    class HostOnly(Executor):
        uses_ray = False

        def _init_executor(self) -> None:
            from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment, parallel_state

            if parallel_state._WORLD is None:
                init_distributed_environment(1, 0, "tcp://127.0.0.1:29614", 0, "gloo")
                ensure_model_parallel_initialized(1, 1, backend="gloo")
            self.runner = Runner(self.vllm_config, torch.device("cpu"))
            self.runner.load_model()

        def get_kv_cache_specs(self) -> list[dict]:
            spec = FullAttentionSpec(block_size=16, num_kv_heads=KV_HEADS, head_size=HEAD, dtype=torch.bfloat16,
                                     use_mla=False)
            return [{f"model.layers.{i}.self_attn.attn": spec for i in range(LAYERS)}]

        def determine_available_memory(self) -> list[int]:
            return [BLOCKS * 16 * LAYERS * 2 * KV_HEADS * HEAD * 2]

        def initialize_from_config(self, configs: list) -> None:
            self.runner.initialize_kv_cache(configs[0])

        def execute_model(self, scheduler_output):  # noqa: ANN001, ANN202
            return self.runner.execute_model(scheduler_output)

        @property
        def max_concurrent_batches(self) -> int:
            return 1

        def check_health(self) -> None:
            return None

        def shutdown(self) -> None:
            return None

        def collective_rpc(self, *args: object, **kwargs: object) -> list:
            return [None]

    return HostOnly


def measure(model: Path, n: int) -> dict[str, float]:
    """Median host seconds of one decode iteration of ``n`` sequences (EngineCore.step)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.engine.core import EngineCore

    args = EngineArgs(model=str(model), tokenizer=str(model), hf_overrides={"vocab_size": TINY}, max_num_seqs=256,
                      block_size=16, disable_log_stats=True, max_model_len=4096, load_format="dummy",
                      skip_tokenizer_init=True, enable_prefix_caching=False)
    core = EngineCore(args.create_engine_config(), _executor(), log_stats=False)
    params = SamplingParams(n=1, temperature=1.0, top_p=1.0, ignore_eos=True, max_tokens=STEPS + WARM + 24)
    rng = random.Random(1)
    for i in range(n):
        core.add_request(EngineCoreRequest(str(i), [rng.randrange(1, TINY - 6) for _ in range(PROMPT)], None, None,
                                           None, params, None, 2, time.time(), None, None, None))
    while any(r.num_computed_tokens < PROMPT for r in core.scheduler.requests.values()):
        core.step()  # the prefill iterations (chunked: 8,192 tokens an iteration)
    for _ in range(WARM):
        core.step()
    steps = timed_steps(core.step)
    assert len(core.scheduler.running) == n  # every sequence decoded in every timed iteration
    step = statistics.median(steps)
    return {"n": n, "step_s": step, "callback_s": 0.0, "exposed_s": step}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm", type=Path, required=True, help="the unpacked vLLM wheel")
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    version = unpacked(args.vllm.resolve())
    os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_USE_V1="1")
    before = module_call()
    _bypass()
    record(args.out, version, sweep(lambda n: measure(args.model, n)), min(before, module_call()))


if __name__ == "__main__":
    main()
