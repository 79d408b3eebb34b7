"""Compute threads of a real run vs. the thread count the profile's compute rates were measured with."""

from __future__ import annotations

import pytest

from devices.errors import FlashsimError
from devices.schema import DeviceProfile, load_profile
from real.runtime.executor_plan import check_threads


def _profile(threads: int | None) -> DeviceProfile:
    data = load_profile("this-host").model_dump(mode="json", exclude_none=True)
    data["compute"].pop("threads", None)
    if threads is not None:
        data["compute"]["threads"] = threads
    return DeviceProfile.model_validate(data)


def test_matching_or_unknown_thread_counts_are_silent(recwarn):
    assert check_threads(2, _profile(2)) is None
    assert check_threads(None, _profile(2)) is None      # the run then uses the profile's count
    assert check_threads(3, _profile(None)) is None      # profile does not say: nothing to check
    assert not recwarn.list


def test_mismatch_warns_loudly():
    with pytest.warns(UserWarning, match="computes with 1 thread") as rec:
        msg = check_threads(1, _profile(2))
    assert msg is not None and msg.startswith("WARNING") and "--threads 1" in msg and "\n" not in msg
    assert str(rec[0].message) == msg


def test_bad_thread_count():
    with pytest.raises(FlashsimError, match="--threads 0: must be >= 1"):
        check_threads(0, _profile(None))


def test_profile_threads_validated():
    with pytest.raises(Exception, match="threads"):
        _profile(0)
