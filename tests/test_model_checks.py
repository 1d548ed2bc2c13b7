"""ModelSpec's validation (model_checks.py): a bad size or an inconsistent hybrid is a SpecError naming the field
and its value."""

from __future__ import annotations

import re

import pytest

from meshplan.errors import SpecError
from meshplan.specs.model_load import model_from_dict

TINY = {"name": "tiny", "num_layers": 2, "hidden_size": 64, "num_heads": 4, "ffn_hidden_size": 256,
        "vocab_size": 100}


@pytest.mark.parametrize("field, value", [("hidden_size", 0), ("num_layers", -2), ("vocab_size", 0),
                                          ("ffn_hidden_size", -1), ("num_heads", 0), ("seq_length", 0),
                                          ("num_kv_heads", -1)])
def test_non_positive_size_names_field_and_value(field: str, value: int) -> None:
    with pytest.raises(SpecError, match=f"{field}={value}"):
        model_from_dict(TINY | {field: value})


@pytest.mark.parametrize(("change", "message"), [
    ({"layer_pattern": "MEX"}, "layer_pattern has 'X'"),
    ({"layer_pattern": "ME"}, "layer_pattern has 2 letters but num_layers=3"),
    ({"layer_pattern": "M*M"}, "has no E (MoE) blocks but num_experts=4"),
    ({"mamba_state": 0}, "mamba_state=0 must be positive"),
    ({"mamba_groups": 3}, "mamba_groups=3 does not divide mamba_heads=4"),
    ({"first_k_dense_layers": 1}, "do not apply to a layer_pattern"),
])
def test_bad_hybrid_specs_name_the_field(change: dict, message: str) -> None:
    base = {"name": "h", "num_layers": 3, "layer_pattern": "ME*", "hidden_size": 64, "num_heads": 4,
            "ffn_hidden_size": 64, "vocab_size": 128, "num_experts": 4, "moe_topk": 2, "mamba_heads": 4,
            "mamba_head_dim": 16, "mamba_state": 16, "mamba_groups": 2}
    with pytest.raises(SpecError, match=re.escape(message)):
        model_from_dict(base | change)


def test_mamba_sizes_need_a_pattern() -> None:
    with pytest.raises(SpecError, match="mamba_heads=4 needs a hybrid layer_pattern"):
        model_from_dict({"name": "x", "num_layers": 2, "hidden_size": 64, "num_heads": 4, "ffn_hidden_size": 64,
                         "vocab_size": 128, "mamba_heads": 4})
