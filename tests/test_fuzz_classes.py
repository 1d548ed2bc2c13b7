"""The fuzz classes of issue 80, each tested as a class rather than by its one repro (goodput for any MTBF:
tests/test_goodput.py; Ctrl-C at any point: tests/test_cli_interrupt.py):

- seeds: every seed meshplan takes (serve's --seed, the load simulator's arrivals, the search's sample) is refused
  outside 0 … 2^64 - 1 with one line (``--seed -1`` was a ValueError from NumPy);
- a missing extra is named, with its install command, by every command that needs one;
- a degenerate config.json (a token id outside the vocabulary, zero-width heads, no layers) is refused before torch
  builds and traces it (a padding id past a one-token vocabulary was an AssertionError in torch);
- bad numbers are refused before the heavy imports (check-step --steps 1 waited 13-44 s for torch first);
- a file with a byte-order mark and CRLF line ends (Windows editors, Excel) reads as its clean twin;
- what a third-party library prints while meshplan calls it is one note, or nothing beside meshplan's error line.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshplan.captured import captured
from meshplan.cli import main
from meshplan.errors import SpecError
from meshplan.files import read_text
from meshplan.search.explore import Explore

SERVE = ["serve", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--input-len", "512", "--output-len",
         "128", "--concurrency", "8", "--requests", "50"]


@pytest.mark.parametrize(("seed", "ok"), [("-1", False), (str(-2**70), False), (str(2**64), False), ("0", True),
                                          (str(2**64 - 1), True)])
def test_every_seed_is_checked_on_the_command_line(capsys, seed, ok):
    code = main([*SERVE, "--seed", seed, "--top", "1"])
    err = capsys.readouterr().err
    assert code == (0 if ok else 2), err
    if not ok:
        assert err.strip() == f"meshplan: error: --seed={seed} is outside 0 … 18,446,744,073,709,551,615"


def test_every_seed_is_checked_in_the_api():
    from meshplan.serve.load import arrivals
    from meshplan.serve.load.lengths import parse_lengths

    lengths = parse_lengths("fixed", 512, 128)
    for bad in (-1, 2**64):
        with pytest.raises(SpecError, match=f"seed={bad} is outside 0"):
            arrivals.poisson(1.0, 10, lengths, bad)
        with pytest.raises(SpecError, match=f"seed={bad} is outside 0"):
            arrivals.closed(4, 10, lengths, bad)
        with pytest.raises(SpecError, match=f"explore: seed={bad} is outside 0"):
            Explore(seed=bad)
    assert len(arrivals.closed(4, 10, lengths, 2**64 - 1).arrival) == 10


def _write_model(tmp: Path) -> str:
    path = tmp / "tiny_factory.py"
    path.write_text("import torch\n\ndef make():\n    return torch.nn.Linear(4, 4)\n")
    return f"{path}:make"


# (the missing module, the extra that brings it, a command line that needs it: {factory} and {tmp} filled in)
NEEDS = [
    ("torch", "torch", "plan --model llama3-8b --system h100 --gpus 8 --autoshard"),
    ("transformers", "hf", "plan --model {config} --system h100 --gpus 8 --autoshard"),
    ("torch", "torch", "trace {factory} --input-shape 2x4 --system h100"),
    ("torch", "torch", "calibrate --quick"),
    ("torch", "torch", "check-step {factory} --input-shape 2x4"),
    ("jinja2", "report", "report --model llama3-8b --system h100 --gpus 8 -o {tmp}/r.html"),
    ("vl_convert", "report", "report --model llama3-8b --system h100 --gpus 8 -o {tmp}/r.html"),
    ("ray", "ray", "sweep --model llama3-8b --systems h100 --gpus 8,16 --ray local -o {tmp}/sweep"),
]


@pytest.mark.parametrize(("module", "extra", "command"), NEEDS, ids=[f"{n[0]}-{n[2].split()[0]}" for n in NEEDS])
def test_every_command_names_the_extra_it_misses(tmp_path, monkeypatch, capsys, module, extra, command):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                                  "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 256}))
    args = command.format(factory=_write_model(tmp_path), tmp=tmp_path, config=config).split()
    monkeypatch.setitem(sys.modules, module, None)  # `import module` raises ModuleNotFoundError, as uninstalled
    code = main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].endswith(f"is not installed: run  pip install 'meshplan[{extra}]'"), err


DEGENERATE = {  # config.json fields over a small Llama: what each does to the model transformers would build
    "padding id past the vocabulary": {"model_type": "phi3", "vocab_size": 1},
    "padding id past a Llama's vocabulary": {"vocab_size": 8, "pad_token_id": 9},
    "zero-width heads": {"head_dim": 0},
    "no layers": {"num_hidden_layers": 0},
    "no width": {"hidden_size": 0},
    "heads that do not divide the width": {"num_attention_heads": 5},
}


@pytest.mark.parametrize("what", sorted(DEGENERATE))
def test_a_degenerate_config_is_refused_before_torch_traces_it(tmp_path, monkeypatch, capsys, what):
    import meshplan.autoshard.models as models

    base = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
            "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 256, "max_position_embeddings": 128}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(base | DEGENERATE[what]))
    monkeypatch.setattr(models, "hf_model", lambda *a, **k: pytest.fail("torch built and traced it"))
    code = main(["plan", "--model", str(path), "--system", "h100", "--gpus", "8", "--autoshard"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("meshplan: error: "), err


REFUSED_EARLY = [
    ["check-step", "{factory}", "--input-shape", "2x4", "--steps", "1"],
    ["check-step", "{factory}", "--input-shape", "2x4", "--world-size", "100000"],
    ["check-step", "{factory}", "--input-shape", "2x4", "--warmup", "-1"],
    ["check-step", "{factory}", "--input-shape", "2x4", "--threads", "0"],
    ["check-step", "{factory}", "--input-shape", "2x4", "--rounds", "1"],
    ["calibrate", "--threads", "0"],
    ["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--autoshard", "--micro-batches", "0"],
]


def test_bad_numbers_are_refused_before_the_heavy_imports(tmp_path):
    """Each in a fresh interpreter: exit 2, one line, and torch never imported (it takes 10-40 s on a busy host)."""
    factory = _write_model(tmp_path)
    probe = ("import sys, json; from meshplan.cli import main; code = main(json.loads(sys.argv[1])); "
             "print(json.dumps([code, 'torch' in sys.modules]))")
    for args in REFUSED_EARLY:
        argv = [a.format(factory=factory) for a in args]
        run = subprocess.run([sys.executable, "-c", probe, json.dumps(argv)], capture_output=True, text=True,
                             timeout=120)
        code, torch_imported = json.loads(run.stdout.strip().splitlines()[-1])
        assert code == 2 and len(run.stderr.strip().splitlines()) == 1, (argv, run.stderr)
        assert not torch_imported, argv


def test_a_byte_order_mark_and_crlf_read_as_the_clean_file(tmp_path):
    from meshplan.serve.load.arrivals import trace
    from meshplan.specs.model_load import load_model

    clean = {"trace.csv": "arrival_s,input_len,output_len\n0,512,128\n0.5,256,64\n",
             "trace.jsonl": '{"arrival_s": 0, "input_len": 512, "output_len": 128}\n'
                            '{"arrival_s": 0.5, "input_len": 256, "output_len": 64}\n',
             "config.json": json.dumps({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                                        "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 256,
                                        "max_position_embeddings": 128}),
             "model.toml": 'name = "tiny"\nnum_layers = 2\nhidden_size = 64\nnum_heads = 4\nffn_hidden_size = 128\n'
                           'vocab_size = 256\nseq_length = 128\n'}
    for name, text in clean.items():
        (tmp_path / "clean").mkdir(exist_ok=True)
        (tmp_path / "windows").mkdir(exist_ok=True)
        (tmp_path / "clean" / name).write_text(text)
        (tmp_path / "windows" / name).write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode())
        assert read_text(tmp_path / "windows" / name, "file") == text
    for kind in ("clean", "windows"):
        assert trace(str(tmp_path / kind / "trace.csv")).input_len.tolist() == [512, 256]
        assert trace(str(tmp_path / kind / "trace.jsonl")).output_len.tolist() == [128, 64]
    assert load_model(str(tmp_path / "windows" / "model.toml")).num_layers == 2
    assert load_model(str(tmp_path / "windows" / "config.json")).hidden_size == 64


def test_third_party_output_is_one_note(capfd):
    """Python's streams, a logging handler made with the old stderr, and C code writing to descriptor 2."""
    stale = logging.StreamHandler(os.fdopen(2, "w", closefd=False))  # a process's stderr, as the library kept it
    logger = logging.getLogger("third-party-test")
    logger.addHandler(stale)
    try:
        with captured("a library") as lines:
            print("advice one")
            logger.warning("advice two")
            os.write(2, b"advice three from C\n")
        assert sorted(lines) == ["advice one", "advice three from C", "advice two"]  # Python's streams first
        assert capfd.readouterr().err == "meshplan: note: a library said: advice one (and 2 more lines)\n"
        with pytest.raises(ValueError), captured("a library"):
            print("advice before a failure")
            raise ValueError("refused")
        assert capfd.readouterr() == ("", "")  # meshplan's own error line stands alone
    finally:
        logger.removeHandler(stale)


def test_presets_is_a_table_with_sizes(capsys):
    """Issue 80: `presets` printed 72 names on one line; now one row each, with the sizes, in a pipe as well."""
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    assert rows["llama3-70b"][1:4] == ["70.6", "B", "-"] and rows["deepseek-v3"][3:5] == ["37.6", "B"]
    assert "h100" in rows and "megatron-core" in rows
    assert main(["presets", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["models"]) >= 70 and {"models", "systems", "frameworks"} == set(data)
