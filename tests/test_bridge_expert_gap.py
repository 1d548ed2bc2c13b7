"""benchmarks/measure/bridge_expert_gap.py: the per-expert gap's arithmetic on made-up numbers, and the layout it reads
from one Megatron-Bridge record (issue 79: why the x86 8-GPU MoE runs read too fast against GB200)."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "measure"))

import bridge_expert_gap as gap  # noqa: E402


def test_step_seconds_from_tokens_per_gpu():
    """8192 sequences of 4096 tokens on 256 GPUs at 3776 tokens/s per GPU: 33.55 M tokens / 966,656 tokens/s."""
    assert gap.step_seconds(8192 * 4096, 3776.0, 256) == pytest.approx(8192 * 4096 / (3776 * 256))
    assert gap.step_seconds(8192 * 4096, 3776.0, 256) == pytest.approx(34.71, abs=0.01)


def test_per_expert_gap_divides_by_experts_layers_and_microbatches():
    """34.71 s measured against 28.27 s priced, 16 local experts, 11.75 MoE layers a rank, 256 micro-batches:
    6.44 s / 48,128 = 134 us."""
    assert gap.per_expert_gap(34.71, 28.27, 16, 11.75, 256) == pytest.approx(6.44 / (16 * 11.75 * 256))
    assert 1e6 * gap.per_expert_gap(34.71, 28.27, 16, 11.75, 256) == pytest.approx(134, abs=1)


@pytest.mark.parametrize("scale", [1.5, 2.0, 4.0])
def test_per_expert_gap_is_monotone(scale):
    """A larger measured step raises the gap; more experts, layers or micro-batches over which a fixed gap spreads
    lower its size (positive gap)."""
    base = gap.per_expert_gap(10.0, 8.0, 4, 12, 64)
    assert gap.per_expert_gap(10.0 * scale, 8.0, 4, 12, 64) > base
    assert gap.per_expert_gap(10.0, 8.0, 4 * scale, 12, 64) < base
    assert gap.per_expert_gap(10.0, 8.0, 4, 12 * scale, 64) < base
    assert gap.per_expert_gap(10.0, 8.0, 4, 12, 64 * scale) < base


def test_layout_of_a_b200_qwen3_record():
    """Qwen3-235B-A22B on 256 B200s at tp 1, pp 8, ep 8, mb 1, gb 8192: 128 / 8 = 16 local experts, 94 / 8 MoE layers
    a rank, dp 32 so 8192 / 32 = 256 micro-batches a rank."""
    wanted = "mbridge_26.04.01_pretrain_DGX-B200_Qwen3-235B-A22B_mxfp8_256gpu"
    lines = (ROOT / "data/validation/published_runs.jsonl").read_text().splitlines()
    record = next(json.loads(line) for line in lines if wanted in line)
    lay = gap.layout(record)
    assert (lay["gpus"], lay["mb"], lay["ep"], lay["local"]) == (256, 1, 8, 16)
    assert lay["moe_layers"] == pytest.approx(94 / 8)
    assert lay["m"] == pytest.approx(256)
    assert lay["tokens"] == 8192 * 4096
