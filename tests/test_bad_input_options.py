"""Bad command-line options of every command (estimate, plan, report, sweep, calibrate), as fuzzing reviews found
them: one line naming the option and its value, exit status 2. Each case is a command line with the words its
error must contain; before these fixes each ended in a traceback, a hang, silently wrong output or a vague message."""

from __future__ import annotations

import pytest

from bad_input_helpers import SMALL, estimate, fails
from meshplan.cli import main
from meshplan.search.combos import divisors


@pytest.mark.parametrize(("extra", "message"), [
    (["--dp", "0"], "dp=0 must be a positive integer"),  # was ZeroDivisionError
    (["--dp", "-64"], "dp=-64 must be a positive integer"),  # was reported as global_batch=-64
    (["--global-batch", "0"], "global-batch=0 must be a positive integer"),  # was silently dp × micro-batch
    (["--recompute-layers", "3"], "recompute_layers=3 needs recompute='full' (got 'selective')"),
    (["--recompute", "full", "--recompute-layers", "300"], "recompute_layers=300 is more than the 32 layers"),
    (["--seq", "100000000000000000000"], "seq=100000000000000000000 must be a positive integer up to"),
    (["--recompute-modules", "attn"], "recompute-modules=attn has 'attn': the modules are core_attn"),
    (["--recompute", "full", "--recompute-modules", "mlp"], "recompute-modules=mlp needs --recompute selective"),
    (["--recompute-modules", "mla_up_proj"], "recompute_modules mla_up_proj needs multi-head latent attention"),
    (["--last-stage-layers", "2"], "last_stage_layers=2 needs pp > 1"),
    (["--pp", "4", "--last-stage-layers", "-1"], "last-stage-layers=-1 is outside 1 … 10,000 (or 0: an even split)"),
    (["--pp", "4", "--last-stage-layers", "31"], "last_stage_layers=31 leaves 1 of num_layers=32"),
])
def test_estimate_options(extra, message, capsys):
    assert message in fails(estimate("llama3-8b", "h100", *extra), capsys)


def test_ring_context_parallelism_of_a_windowed_model_says_what_to_use(capsys):
    message = fails(estimate("gpt-oss-20b", "h100", "--cp", "2"), capsys)
    assert "cp=2 with cp_comm='ring' cannot run sliding-window attention (sliding_window=128)" in message
    assert "--cp-comm allgather" in message
    assert main(estimate("gpt-oss-20b", "h100", "--cp", "2", "--cp-comm", "allgather", "--json")) == 0


@pytest.mark.parametrize(("extra", "message"), [
    (["--gpus", "8", "--global-batch", "0"], "global-batch=0 must be a positive integer"),
    (["--gpus", "1000000000"], "gpus=1000000000 is more than 1,048,576"),  # was a hang (divisors in O(n))
    (["--gpus", "8", "--top", "100000000"], "top=100000000 is outside 1 … 1,000"),  # was 50 s
    (["--gpus", "8", "--tokens", "1e400"], "tokens='1e400' is not a count from 1 to 1e+18"),  # was Infinity in JSON
    (["--gpus", "8", "--tokens", "15T", "--price", "nan"], "price=nan must be a number from 0 to 1e+06"),
    (["--gpus", "8", "--tokens", "15T", "--price", "inf"], "price=inf must be a number from 0 to 1e+06"),
    (["--gpus", "8", "--tokens", ""], "tokens='' is not a count from 1"),  # was ignored
    (["--gpus", "8", "--rank", "cost"], "rank=cost needs --tokens"),  # was ranked by time
    (["--gpus", "8", "--seq", "100000000000000000000"], "seq=100000000000000000000 must be"),  # OverflowError
    (["--gpus", "8", "--recompute-modules", "moe,moe"], "recompute-modules=moe,moe names a module twice"),
    (["--gpus", "8", "--recompute", "none", "--recompute-modules", "moe"],
     "recompute_modules=moe needs selective among recompute (got none)"),
])
def test_plan_options(extra, message, capsys):
    assert message in fails(["plan", "--model", "llama3-8b", "--system", "h100", *extra], capsys)


@pytest.mark.parametrize(("extra", "message"), [
    (["--factors", "1,2"], "factors=1,2 needs --param"),  # was silently a strong-scaling sweep
    (["--param", "hbm_bandwidth", "--factors", "1e308"], "factors='1e308' must be numbers from 1e-06 to 1e+06"),
])
def test_sweep_factors(extra, message, tmp_path, capsys):
    args = ["sweep", "--model", "llama3-8b", "--systems", "h100", "--gpus", "8", "-o", str(tmp_path / "s"), *extra]
    assert message in fails(args, capsys)


@pytest.mark.parametrize(("extra", "message"), [
    (["--world-size", "1000000"], "world-size=1000000 is more than the 64 local ranks"),  # forked without bound
    (["--mesh", "100000x100000x100000"], "ranks is more than the 64 local ranks"),  # was MemoryError
    (["--out", ""], "out='' must end in .toml"),
])
def test_calibrate_sizes_are_bounded_before_forking(extra, message, capsys):
    assert message in fails(["calibrate", "--quick", *extra], capsys)


def test_divisors_in_square_root_time():
    """Pairs (d, n/d) with d ≤ √n: 36 → 1 2 3 4 6 | 9 12 18 36 (6·6 once); 2^20 · 3 has 21 · 2 divisors."""
    assert divisors(36) == [1, 2, 3, 4, 6, 9, 12, 18, 36]
    assert divisors(1) == [1] and divisors(97) == [1, 97]
    assert len(divisors(3 * 2**20)) == 42 and divisors(10**12)[-1] == 10**12


@pytest.mark.parametrize(("args", "message"), [
    (estimate("llama3-8b", "h100", "--global-batch", "9223372036854775808"), "global-batch=9223372036854775808 must"),
    (estimate("llama3-8b", "h100", "--micro-batch", "100000000000000000000"), "micro-batch=100000000000000000000"),
    (["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--global-batch", "100000000000000000"],
     "global-batch=100000000000000000 must be a positive integer up to 2,147,483,647"),  # was a 40 s hang
    (["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--tokens", "1e300", "--price", "1e300"],
     "tokens='1e300' is not a count from 1 to 1e+18"),  # was "cost": Infinity
    (["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--tokens", "15T", "--price", "1e300"],
     "price=1e+300 must be a number from 0 to 1e+06"),
    (["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "8,,16"], "gpus='8,,16' must be integers"),
    (["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--sp", "on,,"], "sp='' must be one of"),
    (estimate("llama3-8b", "h100", "--offload-layers", "100"), "offload_layers=100 is more than the 32 layers"),
    (estimate("llama3-8b", "h100", "--recompute-layers", "-1"),
     "recompute-layers=-1 is outside 1 … 10,000 (or 0: all of them)"),
    (estimate("llama3-8b", "h100", "--etp", "4", "--tp", "8"), "etp=4 but llama3-8b has no experts"),
    (estimate("llama3-8b", "h100", "--lora-targets", "qkv"), "lora-targets=qkv needs --lora-rank"),
    (estimate("../hardware/h100"), "model='../hardware/h100' is not a preset"),
    (["report", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--scaling", "12,20"],
     "scaling='12,20': 12 GPUs is not a whole number of 8-GPU NVLink domains"),  # was dropped silently
    (["report", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--seq", "100000000000000000000"],
     "seq=100000000000000000000 must be a positive integer"),  # as estimate and plan say it
    (["sweep", "--model", "llama3-8b", "--systems", "h100", "--gpus", "8", "--format", ""], "format='' must be"),
    (["sweep", "--model", "llama3-8b", "--systems", "h100", "--gpus", "8", "--nvlink", ""], "nvlink='' must be"),
    (["sweep", "--model", "llama3-8b", "--systems", "h100", "--gpus", "8", "--param", "", "--factors", "1,2"],
     "param='' must be one of"),
    (["sweep", "--model", "llama3-8b", "--systems", "h100", "--gpus", "8", "--param", "hbm_bandwidth", "--factors",
      "1e-300"], "factors='1e-300' must be numbers from 1e-06"),
    (["calibrate", "--quick", "--base", ""], "base='' is empty"),
    (["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--max-plans", "-1"],
     "max-plans=-1 must be a count of plans (0: no limit)"),
    (["report", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--max-plans", "-1"],
     "max-plans=-1 must be a count"),
    (["sweep", "--model", "llama3-8b", "--systems", "h100", "--gpus", "8", "--max-plans", "-1"],
     "max-plans=-1 must be a count"),
    # a space too large is refused before anything runs: the report's own search, a sweep's points
    (["report", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--max-plans", "100"],
     "the search space of llama3-8b on 8 GPUs holds"),
    (["sweep", "--model", "llama3-8b", "--systems", "h100", "--gpus", "8,16", "--max-plans", "100"],
     "the search space of llama3-8b on 8 GPUs holds"),
])
def test_second_round(args, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert message in fails(args, capsys)


@pytest.mark.parametrize(("value", "message"), [
    ("1024", "grad-bytes=1024 must be 2 or 4 (bytes per gradient: bf16 or fp32)"),  # was "No feasible plan", exit 0
    ("3", "grad-bytes=3 must be 2 or 4"),  # was exit 2 after the whole search
    ("1e30", "Invalid value for '--grad-bytes': '1e30' is not a valid integer."),  # was float32 overflow warnings
])
def test_grad_bytes_is_checked_before_the_search(value, message, capsys, monkeypatch):
    monkeypatch.setattr("meshplan.search.run.search", lambda *a, **k: pytest.fail("searched"))
    assert message in fails(["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--grad-bytes",
                             value], capsys)


def test_a_huge_value_is_cut_in_its_message(tmp_path, capsys):
    """A 20,000-character value was echoed whole; now its first 60 characters and its length."""
    err = fails(estimate("x" * 20000), capsys)
    assert len(err) < 300 and "(20,000 characters)" in err
    path = tmp_path / "model.toml"
    path.write_text(SMALL.replace('name = "x"', 'name = "x"\nmlp = "' + "y" * 20000 + '"'))
    err = fails(estimate(str(path)), capsys)
    assert len(err) < 400 and "(20,000 characters)" in err and "mlp=" in err
