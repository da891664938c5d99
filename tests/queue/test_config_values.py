"""``queue/config``'s time keys are refused naming the rule each follows and the value as
written (docs/queue.md, *Configuration*)."""

from __future__ import annotations

import pytest

from cortexfs.errors import CtxError
from cortexfs.queue.layout import QueueConfig

LEASE_RULE = "lease_ttl must be a number of seconds above 0 and at most 31622400 (366 days)"


@pytest.mark.parametrize("value", ["0", "-1", "-0.5", "31622401", "1e999", "nan", "ten", ""])
def test_a_lease_ttl_out_of_its_range_names_the_range_and_the_value(value: str) -> None:
    with pytest.raises(CtxError) as refused:
        QueueConfig.parse(f"lease_ttl={value}\n", origin="queue/config")
    message = refused.value.message
    assert message.startswith(f"queue/config:1: {LEASE_RULE}, not "), message
    assert "non-negative" not in message


@pytest.mark.parametrize(("value", "seconds"), [("0.5", 0.5), ("31622400", 31622400.0)])
def test_a_lease_ttl_within_its_range_is_taken(value: str, seconds: float) -> None:
    assert QueueConfig.parse(f"lease_ttl={value}\n").lease_ttl == seconds
