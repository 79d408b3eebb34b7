"""The profile's `moe:` section: the host-link second hop needs its source and its datasheet rate, and the
achievable rate may not beat the link."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from devices.section_moe import MoECosts

SYNC = {"router_sync_s": 4e-5, "router_sync_source": {"kind": "estimate", "source": "test"}}
SRC = {"kind": "datasheet", "source": "test"}


def test_second_hop_needs_source_and_link_rate() -> None:
    ok = MoECosts(**SYNC, host_copy_bytes_per_s=25e9, host_copy_link_bytes_per_s=31.5e9, host_copy_source=SRC)
    assert ok.host_copy_bytes_per_s == 25e9
    with pytest.raises(ValidationError, match="needs host_copy_source"):
        MoECosts(**SYNC, host_copy_bytes_per_s=25e9, host_copy_link_bytes_per_s=31.5e9)
    with pytest.raises(ValidationError, match="needs host_copy_source"):
        MoECosts(**SYNC, host_copy_bytes_per_s=25e9, host_copy_source=SRC)
    with pytest.raises(ValidationError, match="cannot beat the link"):
        MoECosts(**SYNC, host_copy_bytes_per_s=40e9, host_copy_link_bytes_per_s=31.5e9, host_copy_source=SRC)
    assert MoECosts(**SYNC).host_copy_bytes_per_s is None          # unified memory / CPU hosts: no second hop
