"""A stack can state that its host issues no collective call (issue 79, review22's rank22 item 0): ``collective_host``
0 with ``collective_host_stated`` prices each collective call at 0 host seconds, where an unstated 0 prices it at a
kernel's ``host_dispatch`` (HostCost.per_call). Every preset leaves the flag off, so no estimate of theirs moves."""

from __future__ import annotations

import pytest

from meshplan.specs.host_cost import HostCost
from meshplan.specs.stack import Stack, load_stack, stack_names

US = 1e-6


def test_a_stated_zero_is_no_host_time_and_an_unstated_one_a_kernel_s():
    assert HostCost(per_kernel=38.4 * US, per_collective=0.0).per_call(collective=True) == 0.0
    assert HostCost(per_kernel=38.4 * US).per_call(collective=True) == 38.4 * US
    assert HostCost(per_kernel=38.4 * US, per_collective=0.0).per_call(collective=False) == 38.4 * US
    assert Stack(host_dispatch=38.4 * US).host.per_call(collective=True) == 38.4 * US
    assert Stack(host_dispatch=38.4 * US, collective_host_stated=True).host.per_call(collective=True) == 0.0
    # a price above 0 is stated with or without the flag
    for flag in (False, True):
        stack = Stack(host_dispatch=38.4 * US, collective_host=14.5 * US, collective_host_stated=flag)
        assert stack.host.per_call(collective=True) == 14.5 * US


@pytest.mark.parametrize("name", stack_names())
def test_no_preset_states_a_zero_so_its_collective_calls_cost_what_they_did(name):
    """The default is unchanged: every preset leaves the flag off, and its collective call costs its collective_host
    where that is above 0, else its host_dispatch (the pricing before the flag)."""
    stack = load_stack(name)
    assert not stack.collective_host_stated
    assert stack.host.per_call(collective=True) == (stack.collective_host or stack.host_dispatch)
