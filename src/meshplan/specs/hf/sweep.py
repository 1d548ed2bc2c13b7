"""The registry sweep of issue 51: every causal-LM ``model_type`` transformers registers
(``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``), from its default config (``AutoConfig.for_model(t)``, written out as the
config.json a user would bring), read by meshplan (``load_model``) and compared with the parameter count of the
model transformers builds from it on the meta device. Each type is "exact" (the counts agree), "refused" (a
SpecError saying what is not modelled) or "wrong" (a count that disagrees, the failure the check exists to stop);
a type transformers itself cannot build from its default config is left out. tests/test_hf_registry.py asserts
on it; benchmarks/measure/hf_registry.py prints the tally.
"""

from __future__ import annotations

import tempfile
import warnings
from collections import Counter
from pathlib import Path
from typing import NamedTuple

from meshplan.errors import SpecError
from meshplan.specs.hf.meta import build_meta
from meshplan.specs.model_load import load_model


class Outcome(NamedTuple):
    model_type: str
    kind: str  # "exact", "refused", "wrong"
    detail: str  # the counts, or the refusal's line


def default_config_text(model_type: str) -> str | None:
    """The config.json text of ``model_type``'s default config, or None when transformers cannot make one."""
    import transformers
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return str(transformers.AutoConfig.for_model(model_type).to_json_string(use_diff=False))
    except Exception:  # noqa: BLE001 - a config class that fails on its own defaults is left out
        return None


def sweep_one(model_type: str, folder: Path) -> Outcome | None:
    """One type: its default config.json read by meshplan against the meta-device count (None: not buildable)."""
    import json
    text = default_config_text(model_type)
    if text is None:
        return None
    built = build_meta(json.loads(text))
    if isinstance(built, str):
        return None
    path = folder / model_type / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    reference = built.total  # param_count(built.module), counted as it was built (meta.py)
    try:
        ours = load_model(str(path)).params()
    except SpecError as exc:
        return Outcome(model_type, "refused", str(exc).split(": ", 1)[-1])
    kind = "exact" if ours == reference else "wrong"
    return Outcome(model_type, kind, f"meshplan {ours:,} vs transformers {reference:,}")


def registry_sweep(model_types: list[str] | None = None) -> list[Outcome]:
    """Every causal-LM type (or those given), in name order."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    types = sorted(model_types if model_types is not None else MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    with tempfile.TemporaryDirectory() as folder:
        found = [sweep_one(t, Path(folder)) for t in types]
    return [o for o in found if o is not None]


def tally(outcomes: list[Outcome]) -> dict[str, int]:
    counts = Counter(o.kind for o in outcomes)
    return {k: counts.get(k, 0) for k in ("exact", "refused", "wrong")}
