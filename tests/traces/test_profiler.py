"""SelectInfer offline profiler: hand-computed scores and rankings, per-task base rankings, the
.npz file round trip, and errors (mismatched shapes, damaged files)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from devices.errors import FlashsimError
from tests.traces.test_format import write_trace
from traces.format import open_trace
from traces.profiler import load_neuron_profile, profile_traces, save_profile

# One layer, 4 neurons, 4 tokens: prompt 0 (task "a") = tokens 0, 1; prompt 1 (task "b") = 2, 3.
MAGS = np.array([[[3, 1, 0, 0], [2, 0, 4, 0], [0, 5, 0, 1], [0, 0.5, 0, 6]]], np.float32)
PROMPT = np.array([0, 0, 1, 1], np.int32)


@pytest.fixture
def trace(tmp_path):
    # K = 2: every token's two largest |a| are stored (here: all its non-zero ones)
    return open_trace(write_trace(tmp_path / "t", MAGS > 0, PROMPT, tasks=["a", "b"], mags=MAGS, top_k=2))


def test_scores_by_hand(trace):
    p = profile_traces([trace])
    assert p.meta["score"] == "sum_abs_activation" and p.tasks == ["a", "b"]
    assert p.scores_task["a"][0] == pytest.approx([3 + 2, 1, 4, 0])
    assert p.scores_task["b"][0] == pytest.approx([0, 5 + 0.5, 0, 1 + 6])
    assert p.scores_all[0] == pytest.approx([5, 6.5, 4, 7])
    assert p.base_ranking("a")[0].tolist() == [0, 2, 1, 3]
    assert p.base_ranking("b")[0].tolist() == [3, 1, 0, 2]        # ties (0, 0) by index
    assert p.secondary_ranking()[0].tolist() == [3, 1, 0, 2]
    assert p.meta["tokens_per_task"] == {"a": 2, "b": 2}
    with pytest.raises(FlashsimError, match="task 'c' is not in the profile"):
        p.base_ranking("c")


def test_counts_without_magnitudes(tmp_path):
    t = open_trace(write_trace(tmp_path / "c", MAGS > 0, PROMPT, tasks=["a", "b"]))
    p = profile_traces([t])
    assert p.meta["score"] == "activation_count"
    assert p.scores_all[0] == pytest.approx([2, 3, 1, 2])


def test_several_traces_add_up(trace, tmp_path):
    other = open_trace(write_trace(tmp_path / "o", MAGS > 0, PROMPT, tasks=["a", "c"], mags=MAGS, top_k=2))
    p = profile_traces([trace, other])
    assert p.tasks == ["a", "b", "c"]
    assert p.scores_task["a"][0] == pytest.approx([10, 2, 8, 0])
    assert p.scores_all[0] == pytest.approx([10, 13, 8, 14])
    assert p.meta["tokens_per_task"]["a"] == 4


def test_file_round_trip(trace, tmp_path):
    p = profile_traces([trace])
    out = save_profile(p, tmp_path / "sub" / "prof.npz")
    q = load_neuron_profile(out)
    assert np.array_equal(q.scores_all, p.scores_all) and q.meta == p.meta
    with np.load(out, allow_pickle=False) as z:
        assert z["rank_base.b"][0].tolist() == [3, 1, 0, 2]
        assert z["rank_secondary"].dtype == np.int32
    assert [f.name for f in (tmp_path / "sub").iterdir()] == ["prof.npz"]        # no temporary left


def test_mismatched_shapes(trace, tmp_path):
    other = open_trace(write_trace(tmp_path / "w", np.ones((1, 4, 8), bool)))
    with pytest.raises(FlashsimError, match="1 x 8 neurons, but the first trace has 1 x 4"):
        profile_traces([trace, other])
    with pytest.raises(FlashsimError, match="at least one trace"):
        profile_traces([])


def _arrays(path):
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


@pytest.mark.parametrize("damage, message", [
    ("garbage", "not a readable .npz"),
    ("no_meta", "missing 'meta_json'"),
    ("schema", "schema_version"),
    ("ranking", "not a ranking"),
    ("nan", "NaN or infinite"),
    ("tasks", "does not match"),
    ("missing_rank", "'rank_base.a' is missing"),
])
def test_bad_profile_files(trace, tmp_path, damage, message):
    good = save_profile(profile_traces([trace]), tmp_path / "p.npz")
    a = _arrays(good)
    bad = tmp_path / "bad.npz"
    if damage == "garbage":
        bad.write_bytes(b"not a zip file")
    else:
        if damage == "no_meta":
            del a["meta_json"]
        elif damage == "schema":
            meta = json.loads(a["meta_json"].tobytes())
            meta["schema_version"] = 7
            a["meta_json"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
        elif damage == "ranking":
            a["rank_secondary"][0, 0] = a["rank_secondary"][0, 1]
        elif damage == "nan":
            a["scores_task.a"][0, 0] = np.nan
        elif damage == "tasks":
            del a["scores_task.b"], a["rank_base.b"]
        elif damage == "missing_rank":
            del a["rank_base.a"]
        np.savez(bad, **a)
    with pytest.raises(FlashsimError, match=message):
        load_neuron_profile(bad)
    with pytest.raises(FlashsimError, match="not found"):
        load_neuron_profile(tmp_path / "nope.npz")
    with pytest.raises(FlashsimError, match="must end in .npz"):
        save_profile(profile_traces([trace]), tmp_path / "p.bin")
