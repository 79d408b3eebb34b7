"""Task-aware synthesis (traces/synthetic_tasks.py): the shipped trace's tasks survive `--like` (the
profiler's base/secondary neurons, under its count and its |a| score, agree with the source's at
least as well as the source's two halves agree with each other), the plain statistics keep their
tolerance, and sources with one task or tasks with very few tokens fall back as documented."""

from __future__ import annotations

import numpy as np

from tests.traces.test_format import tiny_spec
from tests.traces.test_synthetic import SHIPPED, assert_matches
from traces.build import write_dense_trace
from traces.format import PromptInfo, open_trace
from traces.synthetic import synthesize
from traces.synthetic_tasks import MIN_TASK_TOKENS


def test_shipped_trace_keeps_tasks(tmp_path):
    src = open_trace(SHIPPED)
    out = synthesize(tmp_path / "syn", src.spec, src.n_tokens, seed=0, like=src)
    assert_matches(out)                                   # the plain statistics, unchanged tolerance
    syn = open_trace(out)
    tasks = syn.manifest.synthetic["tasks"]
    assert tasks["task_aware"] and tasks["fitted_tasks"] == sorted(p.task for p in src.manifest.prompts)
    assert [p.task for p in syn.manifest.prompts] == [p.task for p in src.manifest.prompts]
    for t, f in tasks["active_fraction"]["target"].items():
        assert abs(tasks["active_fraction"]["achieved"][t] - f) < 0.01
    for score in ("count", "magnitude"):                  # the profiler without and with |a|
        res = tasks["profile_check"][score]
        assert res["passes"], score
        for key, floor in res["split_half_floor"].items():
            assert res["overlap"][key]["mean"] >= floor, (score, key)
            assert res["overlap"][key]["mean"] > 4 * res["chance"], (score, key)


def _source(out, tasks: list[str], per: list[int], n: int = 256, seed: int = 3):
    rng = np.random.default_rng(seed)
    t_total = sum(per)
    bias = rng.standard_normal((len(set(tasks)) + 1, n))
    task_ids = {t: i for i, t in enumerate(sorted(set(tasks)))}
    rows = [np.tile(bias[task_ids[t]], (m, 1)) + rng.standard_normal((m, n)) for t, m in zip(tasks, per)]
    acts = (np.concatenate(rows) * 0.1).astype(np.float32)[None]
    infos = [PromptInfo(id=f"p{i}", task=t, n_prompt_tokens=0, n_generated_tokens=m)
             for i, (t, m) in enumerate(zip(tasks, per))]
    return write_dense_trace(out, tiny_spec(1, n), acts, np.arange(t_total) % 64, np.ones(t_total, np.uint8),
                             np.repeat(np.arange(len(per)), per).astype(np.int32), infos, rule="threshold",
                             target_fraction=0.3)


def test_one_task_falls_back_to_plain(tmp_path):
    src = open_trace(_source(tmp_path / "src", ["qa", "qa"], [60, 60]))
    a = open_trace(synthesize(tmp_path / "a", src.spec, 120, seed=1, like=src))
    tasks = a.manifest.synthetic["tasks"]
    assert not tasks["task_aware"] and "fewer than two task labels" in tasks["reason"]
    assert "profile_check" not in tasks


def test_tasks_with_few_tokens_are_not_fitted(tmp_path):
    few = MIN_TASK_TOKENS - 1
    src = open_trace(_source(tmp_path / "src", ["qa", "code", "story"], [80, 80, few]))
    out = synthesize(tmp_path / "syn", src.spec, src.n_tokens, seed=2, like=src)
    tasks = open_trace(out).manifest.synthetic["tasks"]
    assert tasks["task_aware"] and tasks["fitted_tasks"] == ["code", "qa"] and tasks["unfitted_tasks"] == ["story"]
    assert [p.task for p in open_trace(out).manifest.prompts] == ["qa", "code", "story"]
    assert set(tasks["profile_check"]["count"]["overlap"]) == {"secondary", "base.code", "base.qa"}
    # and only one fitted task left: plain synthesis, with the reason
    src2 = open_trace(_source(tmp_path / "src2", ["qa", "story"], [80, few]))
    t2 = open_trace(synthesize(tmp_path / "syn2", src2.spec, src2.n_tokens, seed=2, like=src2)).manifest.synthetic
    assert not t2["tasks"]["task_aware"] and str(MIN_TASK_TOKENS) in t2["tasks"]["reason"]


def test_task_aware_is_deterministic_and_task_specific(tmp_path):
    src = open_trace(_source(tmp_path / "src", ["qa", "code"], [100, 100]))
    a = open_trace(synthesize(tmp_path / "a", src.spec, 200, seed=5, like=src))
    b = open_trace(synthesize(tmp_path / "b", src.spec, 200, seed=5, like=src))
    assert np.array_equal(np.asarray(a.packed_masks(0)), np.asarray(b.packed_masks(0)))
    # the two tasks' hot sets differ in the source by construction; the synthetic keeps which is which
    chk = a.manifest.synthetic["tasks"]["profile_check"]["count"]
    assert chk["overlap"]["base.qa"]["mean"] >= 0.5 and chk["overlap"]["base.code"]["mean"] >= 0.5


def test_a_short_synthetic_trace_checks_only_the_tasks_it_holds(tmp_path):
    """8 tokens of the shipped trace's shape hold the first prompt's task only (the planner
    synthesizes such traces): the profiler check compares that task and names the others."""
    src = open_trace(SHIPPED)
    syn = open_trace(synthesize(tmp_path / "syn", src.spec, 8, seed=0, like=src))
    tasks = syn.manifest.synthetic["tasks"]
    held = sorted({p.task for p in syn.manifest.prompts})
    assert tasks["tasks_without_tokens"] == [t for t in tasks["fitted_tasks"] if t not in held]
    keys = set(tasks["profile_check"]["count"]["overlap"])
    assert keys == {"secondary", *(f"base.{t}" for t in held)}
