"""Issue 48 item 9: every plan / estimate header says the sequence length and the global batch it priced (serve's
the prompt and output lengths), and a config.json model trains at a documented length, not its context."""

from __future__ import annotations

import json
from pathlib import Path

from meshplan.cli import main

QWEN2 = str(Path(__file__).parent / "data" / "hf" / "qwen2-7b" / "config.json")  # max_position_embeddings 131,072


def run(args: list[str], capsys) -> tuple[int, str]:
    code = main(args)
    return code, capsys.readouterr().out


def test_estimate_header_names_seq_and_global_batch(capsys):
    code, out = run(["estimate", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--global-batch",
                     "64"], capsys)
    title = out.splitlines()[0]
    assert code == 0 and "seq 8,192" in title and "global batch 64" in title  # the preset's 8,192 (Llama 3)
    code, out = run(["estimate", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--seq", "2048"],
                    capsys)
    # default global batch ≈ 4M tokens: ceil(4,194,304 / 2,048 / 8) × 8 = 2,048 sequences
    assert code == 0 and "seq 2,048, global batch 2,048" in out.splitlines()[0]


def test_plan_header_names_seq_and_global_batch(capsys):
    code, out = run(["plan", "--model", "gpt2", "--system", "h100", "--gpus", "8", "--global-batch", "64"], capsys)
    assert code == 0
    title = next(line for line in out.splitlines() if line.startswith("best plans:"))
    assert "seq 1,024, global batch 64" in title  # GPT-2's 1,024 positions


def test_serve_header_names_the_lengths(capsys):
    code, out = run(["serve", "--model", "llama3-8b", "--system", "h100", "--gpus", "1", "--input-len", "1000",
                     "--output-len", "200"], capsys)
    assert code == 0 and "1000 in / 200 out" in out


def test_config_json_trains_at_4096_not_its_context(capsys):
    """Qwen2-7B's config.json (as Qwen2.5-7B's) allows 131,072 positions; at that length 8 H100s did not fit
    ("709 GiB DOES NOT FIT"). At model_load.CONFIG_SEQ_LENGTH = 4,096 it fits, and the header says 4,096."""
    code, out = run(["estimate", "--model", QWEN2, "--system", "h100", "--gpus", "8"], capsys)
    assert code == 0 and "seq 4,096" in out.splitlines()[0]
    data = json.loads(run(["estimate", "--model", QWEN2, "--system", "h100", "--gpus", "8", "--json"], capsys)[1])
    assert data["fits"]
    long = json.loads(run(["estimate", "--model", QWEN2, "--system", "h100", "--gpus", "8", "--seq", "131072",
                           "--json"], capsys)[1])
    assert not long["fits"] and long["peak_memory_bytes"] > 8 * data["peak_memory_bytes"]
