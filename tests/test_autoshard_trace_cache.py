"""A preset's trace kept on disk (autoshard/trace_cache.py): planned again from it, the plan is the same one, to the
last bit, and neither PyTorch's tracer nor the module builder runs; any change of what the trace is made from is a
new key; an unreadable record is traced again; ``MESHPLAN_CACHE=off`` keeps nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import pytest

pytest.importorskip("torch")
pytest.importorskip("scipy")

from meshplan.autoshard import planner, trace_cache  # noqa: E402
from meshplan.autoshard.planner import Request, plan_sharding  # noqa: E402

GPT2 = Request(model="gpt2", system="h100", gpus=4, global_batch=4, seq=256, stages="off")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    return tmp_path / "traces"


def _no_tracing(monkeypatch) -> None:
    def refuse(*_: object) -> None:
        raise AssertionError("traced again: the kept trace was not used")

    monkeypatch.setattr(planner, "_trace", refuse)
    monkeypatch.setattr(planner, "load", refuse)


def test_a_kept_trace_plans_the_same_plan_without_tracing(cache, monkeypatch):
    first = plan_sharding(GPT2)
    assert len(list(cache.glob("*.pickle"))) == 1 and "trace" in first.timings
    _no_tracing(monkeypatch)
    again = plan_sharding(GPT2)
    assert "trace (kept)" in again.timings and "build model" not in again.timings
    assert again.intra.choice == first.intra.choice
    assert again.intra.step_time == first.intra.step_time  # the same floats: the same trace, the same program
    assert (again.name, again.params, again.layers, again.traced_layers) == \
        (first.name, first.params, first.layers, first.traced_layers)
    assert again.intra.problem.flow.trace == first.intra.problem.flow.trace


def test_every_input_of_the_trace_is_in_its_key(cache):
    own = planner.own_preset(GPT2)
    assert own is not None
    spec, layers, inputs = own
    key = trace_cache.preset_key(spec, layers, inputs, "bfloat16")
    assert key == trace_cache.preset_key(spec, layers, list(inputs), "bfloat16")
    others = {trace_cache.preset_key(replace(spec, hidden_size=1024), layers, inputs, "bfloat16"),
              trace_cache.preset_key(spec, layers + 1, inputs, "bfloat16"),
              trace_cache.preset_key(spec, layers, [((8, 256), "int64")], "bfloat16"),
              trace_cache.preset_key(spec, layers, inputs, "float32"),
              trace_cache.preset_key(spec, layers, inputs, None)}
    assert key not in others and len(others) == 5
    # a model built by transformers, a factory or a config.json is traced every time
    assert planner.own_preset(replace(GPT2, model="deepseek-v3")) is None
    assert planner.own_preset(replace(GPT2, model="models.py:make")) is None


def test_the_key_follows_the_tracers_source(cache, monkeypatch):
    spec, layers, inputs = planner.own_preset(GPT2) or ((), 0, [])
    key = trace_cache.preset_key(spec, layers, inputs, "bfloat16")
    monkeypatch.setattr(trace_cache, "TRACED_BY", (*trace_cache.TRACED_BY, "autoshard/ops.py"))
    assert trace_cache.preset_key(spec, layers, inputs, "bfloat16") != key


def test_an_unreadable_record_is_traced_again_and_written_over(cache):
    first = plan_sharding(GPT2)
    (path,) = cache.glob("*.pickle")
    path.write_bytes(b"not a trace")
    assert trace_cache.load_trace(path.stem) is None
    again = plan_sharding(GPT2)
    assert "trace" in again.timings and again.intra.step_time == first.intra.step_time
    assert trace_cache.load_trace(path.stem) == first.intra.problem.flow.trace


def test_off_keeps_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHPLAN_CACHE", "off")
    assert trace_cache.cache_dir() is None
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    plan_sharding(GPT2)
    assert not any(tmp_path.iterdir())
    monkeypatch.delenv("MESHPLAN_CACHE")
    assert trace_cache.cache_dir() == tmp_path / "meshplan"


def test_a_kept_trace_is_planned_without_importing_torch(cache):
    """The whole command, a second time in a fresh process: the plan comes from the kept trace, and nothing of
    PyTorch is imported (autoshard/ops.py reads the pointwise tag the trace recorded)."""
    plan_sharding(GPT2)
    code = ("import sys\nfrom meshplan.autoshard.planner import Request, plan_sharding\n"
            "r = plan_sharding(Request(model='gpt2', system='h100', gpus=4, global_batch=4, seq=256, stages='off'))\n"
            "print('trace (kept)' in r.timings, 'torch' in sys.modules)")
    env = {"MESHPLAN_CACHE": str(cache.parent), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.environ.get("PYTHONPATH", "")}  # this checkout's code, whose digest keyed the trace
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["True", "False"]
