"""Issue 47, traces: arrays that are internally inconsistent though their checksums match are
refused at open, naming the array, the layer and token, and the rule."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devices.errors import FlashsimError
from tests.robustness.conftest import assert_refused, cli, rehashed_copy
from traces.checks import FINITE_RULE
from traces.format import open_trace


def _negsum(a): a["abs_sum"][1, 2] = -1.0
def _sumsmall(a): a["abs_sum"][1, 5] = float(a["top_mag"][1, 5, 0]) * 0.5
def _negmag(a): a["top_mag"][0, 1, -1] = -0.5
def _ascmag(a): a["top_mag"][1, 3, :] = np.sort(a["top_mag"][1, 3, :])
def _dupidx(a): a["top_idx"][0, 7, 1] = a["top_idx"][0, 7, 0]
def _allprefill(a): a["phase"][:] = 0
def _badphase(a): a["phase"][4] = 7
def _nanmag(a): a["top_mag"][0, 0, 0] = np.nan
def _infsum(a): a["abs_sum"][0, 3] = np.inf
def _idxrange(a): a["top_idx"][1, 2, 0] = 64
def _prompt_range(a): a["prompt_index"][3] = 9
def _decode_then_prefill(a): a["phase"][:] = 1; a["phase"][5] = 0   # noqa: E702


def _mask_drops_top(a):
    i = int(a["top_idx"][1, 4, 0])
    a["masks"][1, 4, i // 8] &= np.uint8(~(1 << (i % 8)) & 0xFF)


CASES = {"negsum": (_negsum, "abs_sum >= 0", "abs_sum"), "sumsmall": (_sumsmall, "abs_sum >= top magnitude", "abs_sum"),
         "negmag": (_negmag, "magnitudes >= 0", "top_mag"), "ascmag": (_ascmag, "magnitudes descending", "top_mag"),
         "dupidx": (_dupidx, "indices unique", "top_idx"), "allprefill": (_allprefill, "prompt token counts", "phase"),
         "badphase": (_badphase, "phase values", "phase"), "nanmag": (_nanmag, FINITE_RULE, "top_mag"),
         "infsum": (_infsum, FINITE_RULE, "abs_sum"), "idxrange": (_idxrange, "indices in range", "top_idx"),
         "promptrange": (_prompt_range, "prompt_index in range", "prompt_index"),
         "order": (_decode_then_prefill, "prefill before decode", "phase"),
         "masktop": (_mask_drops_top, "mask agrees with magnitudes", "masks")}


@pytest.mark.parametrize("case", sorted(CASES))
def test_issue47_inconsistent_trace_refused(tmp_path, capsys, trace_dir, case):
    mutate, rule, array = CASES[case]
    bad = rehashed_copy(trace_dir, tmp_path / "bad", mutate, rule="topk" if case == "masktop" else None)
    with pytest.raises(FlashsimError, match=f"{array}.npy: .*'{re.escape(rule)}'"):
        open_trace(bad)
    code, _, err = cli(capsys, "trace", "stats", bad)
    assert_refused(code, err, contains=rule)
    out = tmp_path / "r.parquet"
    code, _, err = cli(capsys, "replay", "--trace", bad, "--device", "jetson-orin-nano-8gb", "--records", out)
    assert_refused(code, err, out)


def test_issue47_valid_traces_pass(tmp_path, trace_dir):
    from traces.data import shipped_trace_path

    open_trace(trace_dir)
    open_trace(shipped_trace_path())
    open_trace(rehashed_copy(trace_dir, tmp_path / "topk", lambda a: None, rule="topk"))  # synthetic masks: by |a|


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(array=st.sampled_from(["abs_sum", "top_mag", "top_idx", "phase", "prompt_index"]),
       pos=st.integers(0, 10**6), value=st.one_of(st.floats(-1e6, 1e6), st.just(float("nan"))))
def test_issue47_trace_arrays_fuzzed(tmp_path_factory, trace_dir, array, pos, value):
    """One changed element anywhere: the trace opens (and is then consistent) or is refused cleanly."""
    def mutate(a):
        flat = a[array].reshape(-1)
        v = value
        if flat.dtype.kind in "iu":
            info = np.iinfo(flat.dtype)
            v = int(np.clip(np.nan_to_num(value), info.min, info.max))
        with np.errstate(over="ignore"):          # 1e6 into float16 is inf: refused as not finite
            flat[pos % flat.size] = v
    bad = rehashed_copy(trace_dir, tmp_path_factory.mktemp("fuzz") / "t", mutate)
    try:
        tr = open_trace(bad)
    except FlashsimError as e:
        assert "\n" not in str(e) and array in str(e) or "phase" in str(e) or "masks" in str(e)
        return
    for layer in range(tr.n_layers):          # what opened satisfies the rules
        mag = np.asarray(tr.top(layer)[1], np.float32)
        assert np.all(mag >= 0) and np.all(np.diff(mag, axis=1) <= 0)
        assert np.all(np.asarray(tr.abs_sum(layer)) >= 0)
