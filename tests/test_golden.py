"""Golden outputs (tests/golden/): every model preset × 3 systems × 3 plan templates through ``estimate`` (step time,
breakdown, memory, MFU, the per-op table of one template), the top 5 of five searches, the serving estimates of
``SERVES`` and of every servable preset on one H200 instance, and the sharding planner's own plan and Megatron-LM's
of three presets on one or two 8-GPU nodes (time by part, memory, every parameter's placements) must give what the
reviewed files hold. A change meant to move a number regenerates them in its own commit
(``python tests/golden/generate.py``) and says why."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent / "golden"
_spec = importlib.util.spec_from_file_location("golden_generate", HERE / "generate.py")
generate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(generate)


def _changes(a: object, b: object, path: str = "") -> list[str]:
    """The leaves where ``a`` and ``b`` differ, as 'path: old -> new'."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [c for k in sorted(set(a) | set(b)) if k != "ops" or a.get(k) != b.get(k)
                for c in (_changes(a.get(k), b.get(k), f"{path}.{k}" if path else k) if k != "ops" else [f"{k}"])]
    return [] if a == b else [f"{path}: {a!r} -> {b!r}"]


def _differences(stored: dict, current: dict, limit: int = 8) -> list[str]:
    out = []
    for key in sorted(set(stored) | set(current)):
        changes = _changes(stored.get(key), current.get(key))
        if changes:
            out.append(f"{key}: " + ", ".join(changes[:4]) + (" ..." if len(changes) > 4 else ""))
    return out[:limit] + ([f"... {len(out) - limit} more"] if len(out) > limit else [])


@pytest.mark.parametrize("name", sorted(generate.MAKERS))
def test_golden_outputs_unchanged(name):
    if name == "autoshard.json":
        pytest.importorskip("torch")
        pytest.importorskip("scipy")
    made = generate.MAKERS[name]()
    current = json.loads(json.dumps(made))
    stored = json.loads((HERE / name).read_text())
    diff = _differences(stored, current)
    assert not diff, (f"{name} moved ({len(diff)} shown); if meant, run python tests/golden/generate.py in a "
                      "commit of its own that says why:\n" + "\n".join(diff))


def test_golden_files_cover_every_preset():
    stored = json.loads((HERE / "estimates.json").read_text())
    models = {key.split(" | ")[0] for key in stored}
    assert models == set(generate.preset_names())
    # 3 systems x 3 templates per model, and one per-op table per model
    assert len(stored) == 9 * len(models)
    assert sum("ops" in v for v in stored.values()) == len(models)
