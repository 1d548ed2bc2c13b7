"""One framework's config format as a record: its name, the stack preset its framework runs, the file suffixes and
the option names that tell its files apart, and its two functions (plan and stack -> text, text -> plan and stack).
Each format's module exports its record (megatron.py ``MEGATRON``, torchtitan.py ``TORCHTITAN``, deepspeed.py
``DEEPSPEED``, nemo.py ``NEMO``); configs/__init__.py keeps them in ``FORMATS`` and dispatches ``detect`` /
``emit`` / ``read`` through them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack


@dataclass(frozen=True)
class ConfigFormat:
    name: str  # the format's name: megatron, torchtitan, deepspeed, nemo
    preset: str  # the stack preset its framework runs: read starts from it, emit carries what differs
    suffixes: tuple[str, ...]  # the file suffixes it is saved under (detect's fallback)
    markers: tuple[str, ...]  # what a config of this format names, at least one of them (detect; read refuses none)
    emit: Callable[[ModelSpec, Plan, Stack], str]  # the config text of a plan run by a stack
    read: Callable[[str, ModelSpec, int], tuple[Plan, Stack]]  # the plan and stack of a config text on so many GPUs

    def written_in(self, text: str) -> bool:
        """Whether ``text`` names one of this format's markers."""
        return any(marker in text for marker in self.markers)
