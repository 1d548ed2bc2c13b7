"""``meshplan rl``: the issue's command prints the best colocated and split plans with the phase breakdown and memory
per phase; its JSON; the launches written; bad input as one line and exit 2."""

from __future__ import annotations

import json

import pytest

from bad_input_helpers import fails
from meshplan.cli.main import main

SMALL = ["rl", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--prompts", "32",
         "--samples-per-prompt", "4", "--input-len", "256", "--output-len", "512", "--mean-output", "200",
         "--mini-batches", "2"]


def run(capsys, args: list[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_the_issues_command_prints_colocated_and_split(capsys, monkeypatch):
    """issue 85: Qwen3-30B-A3B on 16 H100s, 512 prompts x 8 samples, 1,024 in / 4,096 out."""
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run(capsys, ["rl", "--model", "qwen3-30b-a3b", "--system", "h100", "--gpus", "16", "--prompts",
                                "512", "--samples-per-prompt", "8", "--input-len", "1024", "--output-len", "4096"])
    assert code == 0
    for text in ("best RL plans: qwen3-30b-a3b on 16 x H100", "the best plan of each set-up, phase by phase",
                 "colocated (16 shared)", "split (8R+8T)", "rollout", "weight transfer", "policy update",
                 "memory per GPU by phase and pool", "KV cache", "rejected:"):
        assert text in out, text


def test_json_has_the_best_of_each_setup(capsys):
    code, out, _ = run(capsys, [*SMALL, "--json", "--setup", "colocated,split"])
    d = json.loads(out)
    assert code == 0 and set(d["best"]) == {"colocated", "split"}
    best = d["plans"][0]
    assert best["iteration_s"] == pytest.approx(min(b["iteration_s"] for b in d["best"].values()))
    assert best["fits"] and sum(best["phases_s"].values()) >= best["iteration_s"] * 0.5
    assert {m["phase"] for m in best["memory"]} >= {"rollout", "actor_update", "sync"}


def test_emit_writes_the_launch(capsys, tmp_path):
    target = tmp_path / "verl.sh"
    code, _, err = run(capsys, [*SMALL, "--setup", "colocated", "--emit", "verl", "--emit-to", str(target)])
    assert code == 0 and "wrote" in err
    text = target.read_text()
    assert "python3 -m verl.trainer.main_ppo --config-name ppo_megatron_trainer" in text
    assert "actor_rollout_ref.rollout.n=4" in text and "data.train_batch_size=32" in text


@pytest.mark.parametrize("extra, field", [
    (["--samples-per-prompt", "1"], "samples_per_prompt=1 must be at least 2"),
    (["--mean-output", "900"], "mean_output=900 must be at most output_len=512"),
    (["--setup", "pipelined"], "setup='pipelined' must be one of"),
    (["--offload", "disk"], "offload='disk' must be one of"),
    (["--lengths", "zipf"], "lengths='zipf' must be fixed, uniform, lognormal"),
    (["--gpus", "12"], "gpus=12 is not a multiple of the NVLink domain size 8"),
    (["--mini-batches", "3"], "mini_batches=3 must divide"),
    (["--output-len", "100000"], "exceed llama3-8b's context"),
    (["--framework", "nope"], "framework"),
])
def test_bad_input_is_one_line(capsys, extra, field):
    line = fails([*SMALL, *extra], capsys)
    assert field in line, line


def test_a_storage_reload_is_priced_slower_than_a_local_copy(capsys):
    """--sync storage: the checkpoint written and read at --storage-bandwidth per node (40 GB/s: 16 GB each way)."""
    base = [*SMALL, "--setup", "colocated", "--offload", "all", "--json"]
    _, local, _ = run(capsys, base)
    _, stored, _ = run(capsys, [*base, "--sync", "storage", "--storage-bandwidth", "40 GB/s"])
    a, b = json.loads(local)["best"]["colocated"], json.loads(stored)["best"]["colocated"]
    assert b["plan"]["sync"] == "storage" and b["phases_s"]["sync"] > a["phases_s"]["sync"]
    assert b["phases_s"]["sync"] >= 2 * 16e9 / 40e9  # written and read once each at least


@pytest.mark.parametrize("extra, field", [
    (["--sync", "carrier-pigeon"], "sync='carrier-pigeon' must be one of"),
    (["--storage-bandwidth", "1 TB"], "storage-bandwidth='1 TB' must be in B/s"),
    (["--storage-bandwidth", "1 B/s"], "storage-bandwidth=1 B/s is outside"),
])
def test_bad_transfer_options_are_one_line(capsys, extra, field):
    line = fails([*SMALL, *extra], capsys)
    assert field in line, line
