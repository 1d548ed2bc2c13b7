"""vLLM V0's host time per decode iteration against the sequences it runs, measured on this CPU in vLLM's own code
(issue 46, item 4: "vLLM V0 ... with its own CPU overhead"; item 3: "the host side ... is CPU work ... measured on the
machine at hand").

vLLM's V0 engine runs one Python loop per iteration (vllm/engine/llm_engine.py ``LLMEngine.step``): the scheduler
picks the sequences (``Scheduler.schedule``), the model runner turns them into input tensors and sampling metadata
(``ModelRunner.prepare_model_input``), the GPU runs the forward pass, the sampler draws the tokens and turns them into
Python objects, and the engine appends each token to its sequence, detokenises it and checks the stop conditions
(``_process_model_outputs``). Only the forward pass is GPU work; the rest is the host's, most of it per sequence.
Here all of that runs as vLLM ships it, through ``LLMEngine.step``, with an executor that stands in for the GPU
worker: it calls the real ``ModelRunner.prepare_model_input`` and the real ``Sampler`` (on logits of a 256-token
vocabulary, so that its tensor work costs what its dispatches cost: a GPU kernel's launch, not a CPU softmax over
the vocabulary), and skips the forward pass. The sampled ids are spread over the tokenizer's vocabulary before the
engine sees them (timed apart and taken off). Sequences decode from 128-token prompts with benchmark_latency's
sampling parameters (temperature 1, top-p 1, ignore_eos), 60 iterations after 3 warm-up ones, their median; three
sweeps over the sizes, and each size's row is the median of its three.

From v0.6.0 the engine processes the last iteration's outputs while the GPU runs the next one ("async output
processing", vllm-project/vllm PRs #7049 and #8050): the model runner calls the engine's callback right after it
launches the forward pass (worker/model_runner.py ``ModelRunner.execute_model``), and the stand-in calls it at that
point too. Its time (``callback_ms``) hides behind the GPU's step; the rest (``exposed_ms``) does not.

Each version's rows are fitted as a + b·n (least squares, n = 1 ... 256 running sequences), exposed and hidden apart.
Seconds on this CPU become seconds on the x86 host the engines' constants refer to (Cluster.python_host = 1) by the
Python speed of the two: one ``nn.Module`` call's own cost (meshplan.measure.host ``module``), timed in this process,
against the 0.84 µs that check-step measured on the lent H200's host (data/measured/gpu/
2026-11-26-nvidia-h200-small-work.json, ``host_costs``). The host's work here is Python and tensor dispatches on
CPU tensors; on a GPU host about 20 of each iteration's dispatches (the input copies and the sampler's kernels) launch
a kernel, some 5 µs each more there than here (0.1 ms an iteration, left out). Not measured either: the forward
pass's own launch (a captured CUDA graph in decode) and, under tensor parallelism, the driver's broadcast of the
inputs to the other workers.

vLLM's wheels are built for CUDA. Their Python runs on a CPU with vLLM's CUDA-only pieces bypassed: its package
``__init__`` (which imports the whole engine and server stack) left empty, ``vllm_flash_attn`` a stub that raises if
called (attention never runs), the attention backend fixed to FLASH_ATTN (what an NVIDIA GPU selects), pinned host
memory off (no CUDA allocator), and, from 0.6, the platform's async-output rule set to CUDA's (on unless
--enforce-eager) and the distributed groups formed over gloo, one rank. Run (one virtual environment per version,
each with torch 2.13 CPU and the wheel's pure-Python dependencies):

    pip download vllm==0.5.3.post1 --no-deps -d /tmp/w && python -m zipfile -e /tmp/w/vllm-*.whl /tmp/v053
    python benchmarks/measure/vllm_v0_host_cpu.py --make-model /tmp/llama-shape
    python benchmarks/measure/vllm_v0_host_cpu.py --vllm /tmp/v053 --model /tmp/llama-shape \\
        --out data/measured/2026-11-27-vllm-host-cpu.json

(``--make-model`` writes a Llama-3-8B config.json and a 32,000-token byte-level BPE tokenizer trained on this
Python's standard library: no model hub is reachable here, and the loop's cost does not depend on the words.)
meshplan's engine presets take their host constants from the file (presets/engines/vllm*.toml, tests/test_vllm_host.py);
benchmarks/measure/vllm_v1_host_cpu.py measures V1's engine core into the same file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
STEPS, WARM, PROMPT, TINY = 60, 3, 128, 256
ROUNDS = 3  # whole sweeps; each size's row is the median of its rounds
MODULE_REFERENCE = 0.8387125e-6  # s: one nn.Module call on the lent H200's host (module docstring)


def make_model(out: Path) -> None:
    """A Llama-3-8B config.json and a byte-level BPE tokenizer of 32,000 tokens (module docstring)."""
    import sysconfig

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
              "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
              "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
              "rope_theta": 500000.0, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
              "tie_word_embeddings": False, "hidden_act": "silu"}
    (out / "config.json").write_text(json.dumps(config))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    files = sorted(str(p) for p in Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    tok.train(files, trainers.BpeTrainer(vocab_size=32000, special_tokens=["<unk>", "<s>", "</s>"],
                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(out)


def _bypass(version: str) -> None:
    """vLLM's CUDA-only pieces, bypassed (module docstring)."""
    stub = types.ModuleType("vllm_flash_attn")

    def no_gpu(*args: object, **kwargs: object) -> None:
        raise RuntimeError("attention does not run in the host benchmark")

    stub.flash_attn_func = stub.flash_attn_varlen_func = stub.flash_attn_with_kvcache = no_gpu
    stub.__version__ = "2.6.2"
    sys.modules["vllm_flash_attn"] = sys.modules["vllm.vllm_flash_attn"] = stub
    import vllm.attention.selector as selector
    import vllm.model_executor.sampling_metadata as sampling
    import vllm.utils as utils

    selector.which_attn_to_use = lambda *a, **k: selector._Backend.FLASH_ATTN
    utils.is_pin_memory_available = sampling.is_pin_memory_available = lambda: False
    if version >= "0.6":
        from vllm.platforms import current_platform

        current_platform.__class__.is_async_output_supported = classmethod(lambda cls, eager: not eager)


def _executor(version: str, stats: dict[str, list[float]]):  # noqa: ANN202
    """The executor that stands in for the GPU worker (module docstring)."""
    import torch
    from vllm.executor.executor_base import ExecutorBase
    from vllm.model_executor.layers.sampler import Sampler
    from vllm.sequence import Logprob
    from vllm.worker.model_runner import ModelRunner

    class HostOnly(ExecutorBase):
        uses_ray = False

        def _init_executor(self) -> None:
            if version >= "0.6":
                from vllm.distributed import (
                    ensure_model_parallel_initialized,
                    init_distributed_environment,
                    parallel_state,
                )

                if parallel_state._WORLD is None:
                    init_distributed_environment(1, 0, "tcp://127.0.0.1:29613", 0, "gloo")
                    ensure_model_parallel_initialized(1, 1, backend="gloo")
            self.device_config.device = torch.device("cpu")
            if version >= "0.6":
                self.runner = ModelRunner(self.vllm_config, kv_cache_dtype="auto", is_driver_worker=True)
            else:
                self.runner = ModelRunner(self.model_config, self.parallel_config, self.scheduler_config,
                                          self.device_config, self.cache_config, self.load_config, None,
                                          kv_cache_dtype="auto", is_driver_worker=True)
            self.runner.pin_memory = False
            self.sampler, self.rng = Sampler(), random.Random(0)

        def determine_num_available_blocks(self) -> tuple[int, int]:
            return 100000, 0

        def initialize_cache(self, gpu_blocks: int, cpu_blocks: int) -> None:
            return None

        def execute_model(self, execute_model_req):  # noqa: ANN001, ANN202
            req = execute_model_req
            t0 = time.perf_counter()
            model_input = self.runner.prepare_model_input(req.seq_group_metadata_list, req.virtual_engine,
                                                          req.finished_requests_ids)
            t1 = time.perf_counter()
            callback = getattr(req, "async_callback", None)
            if callback is not None:  # where the model runner calls it: the forward pass launched
                callback()
            t2 = time.perf_counter()
            rows = len(model_input.sampling_metadata.selected_token_indices)
            out = self.sampler(torch.randn(rows, TINY), model_input.sampling_metadata)
            t3 = time.perf_counter()
            for group in out.outputs:  # the tiny vocabulary's ids spread over the tokenizer's (harness work)
                for sample in group.samples:
                    token = 1000 + self.rng.randrange(30000)
                    sample.logprobs = {token: Logprob(next(iter(sample.logprobs.values())).logprob, 1)}
                    sample.output_token = token
            t4 = time.perf_counter()
            for key, value in (("prepare", t1 - t0), ("callback", t2 - t1), ("sampler", t3 - t2),
                               ("harness", t4 - t3)):
                stats[key].append(value)
            return [out]

        def check_health(self) -> None:
            return None

    for name in ("add_lora", "remove_lora", "pin_lora", "add_prompt_adapter", "remove_prompt_adapter",
                 "pin_prompt_adapter"):
        setattr(HostOnly, name, lambda self, arg: False)
    HostOnly.list_loras = HostOnly.list_prompt_adapters = lambda self: set()
    HostOnly.__abstractmethods__ = frozenset()
    return HostOnly


def measure(version: str, model: Path, n: int) -> dict[str, float]:
    """Median host seconds of one decode iteration of ``n`` sequences, and its parts."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.engine.llm_engine import LLMEngine
    from vllm.sampling_params import SamplingParams

    stats: dict[str, list[float]] = {"prepare": [], "callback": [], "sampler": [], "harness": []}
    args = EngineArgs(model=str(model), tokenizer=str(model), device="cuda", max_num_seqs=256, block_size=16,
                      disable_log_stats=True, max_model_len=4096, load_format="dummy")
    config = args.create_engine_config()
    executor = _executor(version, stats)
    if version >= "0.6":
        config.model_config.use_async_output_proc = True  # as on a GPU with CUDA graphs
        engine = LLMEngine(vllm_config=config, executor_class=executor, log_stats=False)
    else:
        engine = LLMEngine(**config.to_dict(), executor_class=executor, log_stats=False)
    params = SamplingParams(n=1, temperature=1.0, top_p=1.0, ignore_eos=True, max_tokens=STEPS + WARM + 8)
    rng = random.Random(1)
    for i in range(n):
        engine.add_request(str(i), {"prompt_token_ids": [rng.randrange(1000, 31000) for _ in range(PROMPT)]}, params)
    for _ in range(1 + WARM):  # the prefill iteration, then warm-up decode iterations
        engine.step()
    for values in stats.values():
        values.clear()
    steps = timed_steps(engine.step)
    med = {key: statistics.median(values) for key, values in stats.items()}
    step = statistics.median(steps) - med["harness"]
    return {"n": n, "step_s": step, "callback_s": med["callback"], "exposed_s": step - med["callback"],
            "prepare_s": med["prepare"], "sampler_s": med["sampler"]}


def fit(rows: list[dict[str, float]], key: str) -> tuple[float, float]:
    """Least squares a + b·n of ``key`` over the rows."""
    ns, ys = [r["n"] for r in rows], [r[key] for r in rows]
    mean_n, mean_y = statistics.fmean(ns), statistics.fmean(ys)
    slope = sum((x - mean_n) * (y - mean_y) for x, y in zip(ns, ys, strict=True)) / sum((x - mean_n) ** 2 for x in ns)
    return mean_y - slope * mean_n, slope


def module_call() -> float:
    """One nn.Module call's own seconds on this CPU (meshplan.measure.host), the fastest of three measurements."""
    sys.path.insert(0, str(ROOT / "src"))
    import torch

    from meshplan.measure.host import measure_host
    from meshplan.measure.timing import make_clock

    torch.set_num_threads(1)
    return min(measure_host(make_clock("wall", "cpu", 1)).module for _ in range(3))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--make-model", type=Path, help="write the model directory and stop")
    parser.add_argument("--vllm", type=Path, help="the unpacked vLLM wheel")
    parser.add_argument("--model", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.make_model:
        make_model(args.make_model)
        return
    src = args.vllm.resolve()
    (src / "vllm" / "__init__.py").write_text(
        '"""emptied for the host benchmark (benchmarks/measure/vllm_v0_host_cpu.py)"""\n')
    version = unpacked(src)
    os.environ.setdefault("VLLM_ATTENTION_BACKEND", "FLASH_ATTN")
    before = module_call()
    _bypass(version)
    rows = sweep(lambda n: measure(version, args.model, n))
    record(args.out, version, rows, min(before, module_call()))


def timed_steps(step: Callable[[], object]) -> list[float]:
    """Seconds of each of STEPS calls of the engine's ``step``."""
    steps = []
    for _ in range(STEPS):
        start = time.perf_counter()
        step()
        steps.append(time.perf_counter() - start)
    return steps


def unpacked(src: Path) -> str:
    """Put the unpacked wheel ``src`` first on the import path, this process's and its subprocesses' (vLLM's model
    registry inspects models in one), and return its version."""
    sys.path.insert(0, str(src))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])
    return next(p.name.removesuffix(".dist-info").split("-")[1] for p in src.glob("vllm-*.dist-info"))


def sweep(measure_one: Callable[[int], dict[str, float]]) -> list[dict[str, float]]:
    """``measure_one`` at every size, ``ROUNDS`` times over (every size once a round: drift hits all alike), one
    thread; each size's row is the median of its rounds."""
    import torch

    torch.set_num_threads(1)
    rounds: dict[int, list[dict[str, float]]] = {n: [] for n in SIZES}
    for _ in range(ROUNDS):
        for n in SIZES:
            rounds[n].append(measure_one(n))
            print(json.dumps({k.replace("_s", "_ms"): round(v * 1e3, 4) if k != "n" else v
                              for k, v in rounds[n][-1].items()}), flush=True)
    return [{key: statistics.median(r[key] for r in rounds[n]) for key in rounds[n][0]} for n in SIZES]


def record(out: Path | None, version: str, rows: list[dict[str, float]], module: float) -> None:
    """Fit the rows, scale them to the reference host by ``module`` (one nn.Module call here) and add the version to
    ``out`` (benchmarks/measure/vllm_v1_host_cpu.py records V1's the same way)."""
    import torch

    scale = MODULE_REFERENCE / module
    exposed, hidden = fit(rows, "exposed_s"), fit(rows, "callback_s")
    result = {"version": version, "rows": rows, "module_s": module, "to_reference_host": scale,
              "exposed_fit_s": list(exposed), "hidden_fit_s": list(hidden),
              "reference_host": {"iteration_overhead": scale * exposed[0], "sequence_overhead": scale * exposed[1],
                                 "hidden_sequence_overhead": scale * hidden[1]}}
    print(json.dumps(result["reference_host"]))
    if out:
        found = json.loads(out.read_text()) if out.exists() else {
            "what": "vLLM's host seconds per decode iteration against running sequences, on this CPU, and scaled to "
                    "the x86 host of Cluster.python_host = 1", "versions": {}}
        found.update(made_by="benchmarks/measure/vllm_v0_host_cpu.py (V0), benchmarks/measure/vllm_v1_host_cpu.py (V1)",
                     date=datetime.date.today().isoformat(), host=platform.machine(), cpus=os.cpu_count(),
                     python=platform.python_version(), torch=torch.__version__)
        found["versions"][version] = result
        out.write_text(json.dumps(found, indent=1) + "\n")

if __name__ == "__main__":
    main()
