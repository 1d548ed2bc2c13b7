"""A tiny model trains for a few steps from the torchtitan config meshplan emits (issue 47), run by torchtitan's own
Trainer on two CPU processes (gloo) through tests/torchtitan_cpu_train.py, which says why torchtitan 0.2.2 needs a CPU
device module to run without an accelerator.

The plan: 2 data-parallel ranks replicating the model (zero=0: DDP), selective recompute (per-op SAC), micro-batch 2,
global batch 8 (2 accumulation steps). FSDP (zero=3) is not run: FSDP2's reduce-scatter averages with
ReduceOp.PREMUL_SUM, which gloo refuses ("Cannot use ReduceOp.PREMUL_SUM with Gloo"). The model is a flavour meshplan
writes (llama3 TransformerModelArgs, registered by the module the TOML carries); the tokenizer (byte-pair, 128 tokens)
and the data (200 lines of json) are made here, so nothing is downloaded.

What it shows: the loss at step 1 is that of a uniform guess over the vocabulary, ln 128 = 4.85 (± 0.5: a random
initialisation), and after 8 steps at learning rate 0.01 it is at least 0.5 lower (a run on this machine: 4.8 -> 3.2).
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from meshplan.configs import emit
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
VOCAB = 128
TINY = ModelSpec(name="tiny", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, ffn_hidden_size=128,
                 vocab_size=VOCAB, seq_length=32, mlp="swiglu", norm="rmsnorm", rope_theta=10000.0)


def _assets(folder: Path) -> None:
    """A byte-pair tokenizer of VOCAB tokens (tokenizer.json, as torchtitan's HuggingFaceTokenizer reads it) and the
    lines it is trained on as a json dataset."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    texts = [f"the quick brown fox number {i} jumps over the lazy dog and runs home again" for i in range(200)]
    (folder / "assets").mkdir()
    (folder / "data").mkdir()
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>"]))
    assert tokenizer.get_vocab_size() == VOCAB
    tokenizer.save(str(folder / "assets" / "tokenizer.json"))
    (folder / "assets" / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    (folder / "data" / "train.json").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))


def _flavour_module(text: str, folder: Path) -> None:
    """The flavour module the TOML carries, saved as its comment says."""
    lines = text.splitlines()
    start, end = lines.index("# ---- meshplan_tiny.py ----"), lines.index("# ---- end of meshplan_tiny.py ----")
    (folder / "meshplan_tiny.py").write_text("\n".join(ln.removeprefix("#").removeprefix(" ")
                                                       for ln in lines[start + 1:end]) + "\n")


def test_torchtitan_trains_a_tiny_model_from_the_emitted_config(tmp_path):
    pytest.importorskip("torchtitan")
    pytest.importorskip("tokenizers")
    _assets(tmp_path)
    plan = Plan(dp=2, micro_batch=2, global_batch=8, zero=0, recompute="selective", recompute_modules=("op_sac",))
    text = emit("torchtitan", TINY, plan, load_stack("torchtitan"))
    (tmp_path / "job.toml").write_text(text)
    _flavour_module(text, tmp_path)
    runner = Path(__file__).parent / "torchtitan_cpu_train.py"
    env = os.environ | {"OMP_NUM_THREADS": "1", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
                        "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    with socket.socket() as probe:  # a free port: other test sessions on this machine may hold a fixed one
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", port,
               str(runner), "--job.config_file", "job.toml", "--training.steps", "8", "--training.dataset", "c4_test",
               "--training.dataset_path", "data", "--model.hf_assets_path", "assets", "--metrics.log_freq", "1",
               "--job.dump_folder", "out", "--optimizer.lr", "0.01", "--lr_scheduler.warmup_steps", "1",
               "--debug.seed", "0"]  # one initialisation every run: the first loss is then the same
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    log = re.sub(r"\x1b\[[0-9;]*m", "", run.stdout + run.stderr)
    # a rank that dies prints faulthandler's list of loaded extension modules, a line of thousands of characters:
    # leave it out, so the rank's own last words and torchrun's summary both fit the message
    log = "\n".join(line for line in log.splitlines() if "Extension modules:" not in line)
    assert run.returncode == 0, log[-5000:]
    losses = {int(step): float(loss) for step, loss in re.findall(r"step:\s*(\d+)\s+loss:\s*([\d.]+)", log)}
    assert sorted(losses) == list(range(1, 9)), log[-3000:]
    assert abs(losses[1] - math.log(VOCAB)) < 0.5, losses
    assert losses[8] < losses[1] - 0.5, losses
