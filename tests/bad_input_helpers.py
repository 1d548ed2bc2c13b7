"""What the bad-input tests share: ``fails`` (run the CLI; one line on stderr, exit status 2, no traceback and no
internal error), command lines and files to break (an estimate command, a Hugging Face config.json, a copy of the
H100 system preset with one line replaced) and small model configurations to break them with."""

from __future__ import annotations

import json
from pathlib import Path

from meshplan.cli import main

H100 = Path(__file__).parents[1] / "src" / "meshplan" / "presets" / "hardware" / "h100.toml"
LLAMA = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1376, "num_attention_heads": 8,
         "num_key_value_heads": 4, "num_hidden_layers": 4, "vocab_size": 32000, "max_position_embeddings": 1024}
QWEN_MOE = {**LLAMA, "model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2,
            "moe_intermediate_size": 256}
DEEPSEEK = {**LLAMA, "model_type": "deepseek_v3", "qk_nope_head_dim": 64, "qk_rope_head_dim": 32,
            "kv_lora_rank": 128, "v_head_dim": 64, "n_routed_experts": 8, "num_experts_per_tok": 2,
            "moe_intermediate_size": 256}
SMALL = 'name = "x"\nnum_layers = 2\nhidden_size = 64\nnum_heads = 4\nffn_hidden_size = 128\nvocab_size = 100\n'


def fails(args: list[str], capsys) -> str:
    """Run the CLI; assert one line on stderr, exit status 2, no traceback and no internal error; the line."""
    code = main(args)
    _, err = capsys.readouterr()
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and "internal error" not in err, err
    return err.strip()


def estimate(model: str = "llama3-8b", system: str = "h100", *extra: str) -> list[str]:
    return ["estimate", "--model", model, "--system", system, "--gpus", "8", *extra]


def hf(tmp_path: Path, config: dict, name: str = "m") -> str:
    (tmp_path / name).mkdir()
    path = tmp_path / name / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


def system(tmp_path: Path, old: str, new: str) -> str:
    text = H100.read_text()
    assert old in text
    path = tmp_path / "system.toml"
    path.write_text(text.replace(old, new, 1))
    return str(path)
