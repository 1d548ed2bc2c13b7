"""Token-drop MoE (Plan.moe_expert_capacity_factor, Plan.moe_pad_expert_input_to_capacity): what an expert's capacity
bounds and what the check of a plan refuses. Dropless MoE (the factor None, Megatron-Core's default) routes every
token to its k experts, however many reach one expert; with a capacity factor F each expert takes at most its
capacity of this rank's routed rows and drops the rest (GShard, Switch Transformer; Megatron-Core MoE).

Sources (Megatron-LM, tag core_v0.14.0 @ 23e00ed, the Megatron-Core of the 25.09 NeMo container, and core_v0.16.1 @
55ac708 / core_v0.17.0 @ 9539a12, the same code):
- the capacity: ``moe_utils.get_capacity(num_tokens, num_experts, capacity_factor)`` =
  ``ceil(num_tokens / num_experts * capacity_factor)``, called by the all-to-all dispatcher with num_tokens = the
  rows this rank routes x topk (token_dispatcher.py MoEAlltoAllTokenDispatcher.preprocess, core_v0.14.0:444-452);
- padded (``moe_pad_expert_input_to_capacity``, "drop_and_pad"): every expert gets exactly its capacity from every
  rank, ``num_out_tokens = capacity * num_experts``, and the counts per local expert are a host tensor
  (``torch.full((num_local_experts,), capacity * tp_size * ep_size)``, :453-465): ``_maybe_dtoh_and_synchronize``
  copies and waits on nothing (:827, "if not self.drop_and_pad"), so the experts' split sizes are known on the host
  and the dispatch runs without the tokens-per-expert sync (``host_known``);
- not padded: the router drops what passes each expert's capacity, the rows left are counted on the device and
  synchronised to the host before the first permutation (:470-479, "When using token dropping ..., output size is
  dynamic. Need to sync output size GPU->CPU"): the sync stays, the rows are the expected min(load, capacity) of
  each expert, with routing balanced (cost/mlp_moe.py: the NVIDIA tables balance it) each expert's mean load;
- what it runs with: TransformerConfig.__post_init__ (core_v0.16.1 transformer_config.py:1105-1135) takes a negative
  factor as None and refuses the padding without a factor; Megatron-Bridge's ``apply_moe_token_drop``
  (src/megatron/bridge/training/utils/moe_token_drop.py @ v0.1.0rc3 bf71eba) asserts the alltoall dispatcher.
  meshplan prices the all-to-all dispatcher's token drop only (the flex dispatcher's HybridEP padding and the
  all-gather dispatcher are refused, ``refusals``).
"""

from __future__ import annotations

import math

import numpy as np

from meshplan import ranges
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.xp import Num, minimum


def capacity(plan: Plan, routed: Num, topk: int, experts: int) -> Num:
    """Rows one expert takes from this rank: ceil(routed x topk / experts x F) (get_capacity, module docstring)."""
    factor = plan.moe_expert_capacity_factor
    assert factor is not None
    value = routed * topk / experts * factor
    return float(math.ceil(value)) if isinstance(value, (int, float)) else np.ceil(value)


def routed_rows(plan: Plan, routed: Num, topk: int, experts: int) -> Num:
    """The rows this rank's ``routed`` tokens become after the router: routed x topk dropless; capacity x experts
    padded; not padded, each expert's min(mean load, capacity) (module docstring)."""
    rows = routed * topk
    if plan.moe_expert_capacity_factor is None:
        return rows
    slots = capacity(plan, routed, topk, experts) * experts
    return slots if plan.moe_pad_expert_input_to_capacity else minimum(rows, slots)


def host_known(plan: Plan) -> bool:
    """The experts' split sizes are known on the host (padded to capacity): no tokens-per-expert sync."""
    return plan.moe_expert_capacity_factor is not None and plan.moe_pad_expert_input_to_capacity


def aligned(plan: Plan, routed: Num, topk: int, experts: int, align: int) -> Num:
    """Every local expert's count a multiple of ``align`` rows: padded to capacity, each expert's count is
    capacity x etp x ep (token_dispatcher.py core_v0.14.0:453-465, the tp group there the expert-tensor one), which
    Transformer Engine's Fp8Padding then leaves as it is (cost/moe_permute.py fp8_padding)."""
    if not host_known(plan):
        return False
    count = capacity(plan, routed, topk, experts) * plan.etp * plan.ep
    return count % align == 0  # a bool, or one a size where the sizes are a search's


def refusals(model: ModelSpec, plan: Plan, dispatcher: str) -> list[str]:
    """What the check of a plan refuses about its token drop (module docstring), each one line with its values."""
    factor, pad = plan.moe_expert_capacity_factor, plan.moe_pad_expert_input_to_capacity
    if factor is None:  # TransformerConfig refuses it too (module docstring)
        return ["moe_pad_expert_input_to_capacity=true needs moe_expert_capacity_factor"] if pad else []
    if isinstance(factor, bool) or not isinstance(factor, (int, float)):
        return [f"moe_expert_capacity_factor={factor!r} must be a number (or none: dropless)"]
    if message := ranges.problem("moe_expert_capacity_factor", factor):
        return [message]
    if not model.is_moe:
        return [f"moe_expert_capacity_factor={factor} but {model.name} has no experts"]
    if dispatcher != "alltoall":
        return [f"moe_expert_capacity_factor={factor} with moe_dispatcher={dispatcher}: meshplan prices token drop on "
                "the alltoall dispatcher only (Megatron-Bridge apply_moe_token_drop asserts it)"]
    return []
