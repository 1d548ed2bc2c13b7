"""A Hugging Face model built on PyTorch's meta device: the reference every config.json import is checked against.

``build_meta(config)`` builds ``AutoModelForCausalLM.from_config`` under ``torch.device("meta")`` (tensors with
shapes and no storage: no memory, no weights, milliseconds per model; PyTorch docs, "Meta device") from the
config.json dict, and returns what the checks need (``MetaModel``): the parameter count, the decoder layers and
each one's count, the module itself. ``sum(p.numel() for p in model.parameters())`` counts a tied weight once;
the router score-correction bias of DeepSeek-V3-style routers (``e_score_correction_bias``) is a buffer in
transformers and an ``nn.Parameter`` in the checkpoints' own modeling code and a tensor in their weights, so it is
counted as a parameter (ModelSpec's ``router_bias``). Builds are cached by the config's JSON text. torch's weight
initialisers are skipped while a model is built (``_torch_init_skipped``): a meta tensor has no values to set.

transformers and torch are optional (the ``hf`` extra): ``available()`` says whether they import.
"""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from meshplan.captured import captured

# config.json keys that describe how the weights are stored or where remote code lives, not the model's structure
_NOT_STRUCTURE = ("quantization_config", "auto_map", "torch_dtype", "dtype", "transformers_version")
SCORE_BIAS = "e_score_correction_bias"



@dataclass(frozen=True)
class MetaModel:
    """A model built on the meta device: ``total`` parameters (tied weights once, score-correction biases
    included), ``layer_path`` the decoder layers' ModuleList and ``layers`` each one's parameters (a weight shared
    by several layers counted in the first), ``module`` the model and ``config`` its transformers config."""

    model_type: str
    total: int
    layer_path: str
    layers: tuple[int, ...]
    module: Any
    config: Any
    encoder_decoder: bool = False  # the config's is_encoder_decoder, before the causal-LM class changed it

    @property
    def outside_layers(self) -> int:
        """Parameters outside the decoder layers: embeddings, final norm, head (and anything else built)."""
        return self.total - sum(self.layers)


@lru_cache(maxsize=1)
def available() -> bool:
    """Whether torch and transformers import (the ``hf`` extra)."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def transformers_registers(model_type: str) -> bool:
    """Whether transformers has a config class for ``model_type`` (models on the Hub with their own modeling code,
    ``auto_map``, are not)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    return model_type in CONFIG_MAPPING_NAMES


def build_meta(config: dict[str, Any]) -> MetaModel | str:
    """The model ``config`` describes, built on the meta device, or why it cannot be built (one line)."""
    kept = {k: v for k, v in config.items() if k not in _NOT_STRUCTURE}
    return _build(json.dumps(kept, sort_keys=True, default=str))


def param_count(module: Any, seen: set[int] | None = None) -> int:
    """Parameters of ``module`` not in ``seen`` (ids, updated), and its score-correction bias buffers."""
    seen = set() if seen is None else seen
    total = 0
    for p in module.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total + sum(b.numel() for n, b in module.named_buffers() if n.endswith(SCORE_BIAS))


@lru_cache(maxsize=64)
def _build(text: str) -> MetaModel | str:
    import torch
    import transformers
    config = json.loads(text)
    config = {k: _floats(v) for k, v in config.items()}
    model_type = str(config.pop("model_type", "") or "")
    if not transformers_registers(model_type):
        return f"transformers {transformers.__version__} has no model_type={model_type!r}"
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return (f"transformers {transformers.__version__} has no causal language model for it (an encoder, "
                "encoder-decoder or other model; meshplan reads decoder-only language models)")
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # its advice on building a model is not the user's business here
    try:
        with warnings.catch_warnings(), captured("transformers"):  # what it prints: one note (captured.py)
            warnings.simplefilter("ignore")
            cfg = transformers.AutoConfig.for_model(model_type, **config)
            encoder_decoder = bool(getattr(cfg, "is_encoder_decoder", False))
            with torch.device("meta"), _torch_init_skipped():
                model = transformers.AutoModelForCausalLM.from_config(cfg)
    except Exception as exc:  # noqa: BLE001 - any failure of a third-party build is reported as one line
        first = (str(exc).strip().splitlines() or [""])[0][:160]
        return f"transformers {transformers.__version__} cannot build it ({type(exc).__name__}: {first})"
    finally:
        transformers.logging.set_verbosity(verbosity)
    path, layers = _decoder_layers(model, cfg)
    seen: set[int] = set()
    counts = tuple(param_count(layer, seen) for layer in layers)
    return MetaModel(model_type, param_count(model), path, counts, model, cfg, encoder_decoder)


# torch.nn.init's in-place initialisers (torch/nn/init.py): each fills its tensor and returns it
_INITIALISERS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
                 "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_")


def _unchanged(tensor: Any, *args: Any, **kwargs: Any) -> Any:
    return tensor


@contextmanager
def _torch_init_skipped() -> Iterator[None]:
    """torch.nn.init's initialisers return their tensor untouched while a model is built on the meta device. Every
    ``nn.Linear`` and ``nn.Embedding`` fills its new weight in its own ``reset_parameters`` (torch 2.x,
    torch/nn/modules/linear.py and sparse.py), on a meta tensor a no-op that still dispatches each op: the 194 builds
    of the registry sweep (sweep.py) took 25.6 s of CPU with them and 18.0 s without (means of three alternating
    rounds in one process, identical outcomes). transformers' own ``no_init_weights`` (transformers 5.x,
    initialization.py) skips the same fills but also makes ``init_weights`` a no-op, and with it the tying of shared
    weights that ``total`` counts once, so it is not used here. The names are replaced also where torch's modules
    imported them (``from torch.nn.init import xavier_uniform_``: torch.nn.modules.activation), and restored after."""
    import torch.nn.init as init
    originals = {name: getattr(init, name) for name in _INITIALISERS if hasattr(init, name)}
    replaced: list[tuple[Any, str, Any]] = []
    try:
        for module_name, module in list(sys.modules.items()):
            if module is init or (module_name.startswith("torch.nn.modules.") and module is not None):
                for name, func in originals.items():
                    if getattr(module, name, None) is func:
                        replaced.append((module, name, func))
                        setattr(module, name, _unchanged)
        yield
    finally:
        for module, name, func in replaced:
            setattr(module, name, func)


def _floats(value: Any) -> Any:
    """transformers writes a non-finite float to config.json as {"__float__": "Infinity"} (Mamba-2's
    time_step_limit; configuration_utils.py) and reads it back as the float."""
    if isinstance(value, dict):
        if set(value) == {"__float__"}:
            return float(value["__float__"])
        return {k: _floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_floats(v) for v in value]
    return value


def _decoder_layers(model: Any, cfg: Any) -> tuple[str, list[Any]]:
    """The ModuleList of decoder layers: of those as long as ``num_hidden_layers`` (else of all), the one holding
    the most parameters."""
    import torch
    lists = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m)]
    want = getattr(cfg, "num_hidden_layers", None)
    matching = [(n, m) for n, m in lists if len(m) == want] or lists
    if not matching:
        return "", []
    name, best = max(matching, key=lambda nm: sum(p.numel() for p in nm[1].parameters()))
    return name, list(best)
