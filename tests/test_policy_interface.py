"""The seam between policies and the backends (sim/policies/base.py's hooks, sim/policies/registry.py's
discovery): a policy is one module that both backends run with no other file touched, a backend asks
only through declared hooks (greps below), refuses a policy missing a hook it needs with one line
naming the hook, and the real backend refuses a prefetch it would not issue where the simulator
times it."""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from devices import load_profile
from devices.errors import FlashsimError
from flashsim.main import main
from sim import bitsets
from sim.policies import registry
from sim.policies.base import CacheSteps, MissingHookError, Predictor, Residency

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = str(ROOT / "traces" / "data" / "smollm2-135m-builtin")

# The throwaway policy package: one module, found through a `flashsim.policies` entry point of a
# distribution on sys.path (what `pip install` of an out-of-tree package leaves behind).
THROWAWAY_MODULE = '''
"""A throwaway policy module: a residency and a predictor, registered by name."""
from dataclasses import dataclass

import numpy as np

from sim import bitsets
from sim.params import param
from sim.policies.base import Predictor, Residency
from sim.policies.cache import CachedResidency
from sim.policies.registry import PREDICTORS, RESIDENCY


@RESIDENCY.register("throwaway-window")
class ThrowawayWindow(CachedResidency, Residency):
    """The first `pinned` neurons of each layer resident for the run; the rest kept for k steps."""

    manages_cache = True

    @dataclass(frozen=True)
    class Params:
        k: int = param(2, "steps a computed neuron stays resident")
        pinned: int = param(0, "neurons of each layer resident for the whole run")

    def window_k(self):
        return self.params.k

    def static_mask(self, layer):
        mask = np.zeros(self.ctx.n_neurons, bool)
        mask[: self.params.pinned] = True
        return bitsets.pack(mask)


@PREDICTORS.register("throwaway-sticky")
class StickyPredictor(Predictor):
    """Each step computes its true active set and the previous step's."""

    def predict(self, layer, steps, needed):
        prev = self.state.get(layer, np.zeros(needed.shape[1], needed.dtype))
        before = np.concatenate([prev[None, :], needed[:-1]])
        if len(needed):
            self.state[layer] = needed[-1].copy()
        return needed | before
'''


@pytest.fixture(scope="module")
def throwaway(tmp_path_factory):
    """A temporary package + dist-info on sys.path; removed from the registries afterwards."""
    root = tmp_path_factory.mktemp("plugin")
    pkg = root / "flashsim_throwaway"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "policy.py").write_text(textwrap.dedent(THROWAWAY_MODULE))
    dist = root / "flashsim_throwaway-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: flashsim-throwaway\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[flashsim.policies]\nthrowaway = flashsim_throwaway.policy\n")
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))
    registry.RESIDENCY._classes.pop("throwaway-window", None)
    registry.PREDICTORS._classes.pop("throwaway-sticky", None)
    registry._entry_points_seen.discard("flashsim_throwaway.policy")
    for m in [m for m in sys.modules if m.startswith("flashsim_throwaway")]:
        del sys.modules[m]


def _replay(capsys, *sets: str, engine: str) -> dict:
    args = ["replay", "--trace", SHIPPED, "--device", "jetson-orin-nano-8gb", "--tokens", "4", "--prompt-tokens",
            "2", "--dram-budget", "300MiB", "--engine", engine, "--json"]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_throwaway_policy_replays_in_the_des_and_the_fast_path(throwaway, capsys):
    sets = ("residency=throwaway-window", "throwaway-window.k=2", "predictor=throwaway-sticky")
    des = _replay(capsys, *sets, engine="des")
    fast = _replay(capsys, *sets, engine="fast")
    assert des["config"]["policies"]["residency"] == {"name": "throwaway-window", "k": 2, "pinned": 0}
    assert des["config"]["policies"]["predictor"]["name"] == "throwaway-sticky"
    assert des["engine"] == "des" and fast["engine"] == "fast"
    assert fast["flash_bytes_per_token"] == des["flash_bytes_per_token"] > 0
    assert fast["ms_per_token"] == pytest.approx(des["ms_per_token"], rel=0.01)
    # the same keep rule as the built-in window (without its insert copy) reads the same bytes
    same = _replay(capsys, "residency=window", "window.k=2", "window.insert_copy=false",
                   "predictor=throwaway-sticky", engine="fast")
    assert same["flash_bytes_per_token"] == des["flash_bytes_per_token"]
    # its static set is its own: pinned neurons are fixed memory and never read
    pinned = _replay(capsys, *sets, "throwaway-window.pinned=64", engine="fast")
    assert pinned["flash_bytes_per_token"] < des["flash_bytes_per_token"]


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory):
    pytest.importorskip("torch")
    from real.runtime.shape_mode import shape_trace_like
    from real.weights.convert import write_shape_store
    from real.weights.store import open_store
    from tests.real.conftest import tiny_spec
    from traces.format import open_trace

    root = tmp_path_factory.mktemp("tiny-store")
    store = open_store(write_shape_store(tiny_spec(d_model=128, d_ff=256, n_layers=2), root / "store", seed=3,
                                         dtype="fp32"))
    trace = open_trace(shape_trace_like(store.spec, root / "trace", 6, seed=5, active_fraction=0.2, hot_skew=0.3))
    return store, trace


def _real_run(store, trace, *sets: str) -> list[str]:
    args = ["real", "run", "--store", str(store.path), "--trace", str(trace.path), "--dram-budget", "64MiB",
            "--threads", "1", "--json", "--set", "workload.prompt_tokens=0"]
    for s in sets:
        args += ["--set", s]
    return args


def test_throwaway_policy_runs_on_the_real_backend(throwaway, tiny_store, capsys):
    store, trace = tiny_store
    rc = main(_real_run(store, trace, "residency=throwaway-window", "throwaway-window.pinned=16",
                        "predictor=throwaway-sticky", "prefetch=delta"))
    out = capsys.readouterr()
    assert rc == 0, out.err
    doc = json.loads(out.out)
    assert doc["config"]["policies"]["residency"]["name"] == "throwaway-window"
    assert doc["config"]["policies"]["predictor"]["name"] == "throwaway-sticky"
    assert doc["summary"]["steps"] == trace.n_tokens and doc["summary"]["bytes_read_per_token"] > 0


def test_real_run_refuses_lookahead_prefetch_in_one_line(tiny_store, capsys):
    """It issues a prefetch at the end of the previous step only: lookahead would be timed as delta."""
    store, trace = tiny_store
    assert main(_real_run(store, trace, "residency=window", "predictor=oracle", "prefetch=lookahead")) == 2
    err = capsys.readouterr().err
    assert "prefetch 'lookahead' issues its reads at previous-layer (Prefetcher.issue_point)" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


class StreamingWithoutKept(Residency):
    """Streams every computed neuron and keeps nothing, but does not say so through `kept`."""

    def advance(self, layer, steps, computed, next_hint, cap_neurons):  # type: ignore[no-untyped-def]
        n = bitsets.count(computed)
        z = np.zeros(len(computed), np.int64)
        return CacheSteps(demand=computed.copy(), prefetch=np.zeros_like(computed), hits=z, before=z, after=z,
                          peak=n, inserted=n, evicted=n)


class PredictorWithoutPredict(Predictor):
    """Declares no `predict`, which every run asks."""


class PagedWithoutPages(Residency):
    """Page-granular, without the page hooks."""

    page_granular = True

    def advance(self, layer, steps, computed, next_hint, cap_neurons):  # type: ignore[no-untyped-def]
        raise AssertionError("a page-granular residency is never advanced")


def _built(*sets: str):
    from sim.config import RunConfig
    from sim.engine import build
    from traces.format import open_trace

    cfg = RunConfig().with_overrides(["workload.tokens=4", *sets])
    return build(open_trace(SHIPPED), None, load_profile("jetson-orin-nano-8gb"), cfg)


def test_a_backend_refuses_a_policy_without_a_hook_it_needs():
    from real.runtime.executor_plan import check_executable
    from traces.format import open_trace

    sim = _built("residency=tests.test_policy_interface:StreamingWithoutKept", "predictor=oracle")
    assert sim.run(fast=False).summary()["flash_bytes_per_token"] > 0      # the simulator needs no `kept`
    with pytest.raises(MissingHookError, match=r"does not implement Residency\.kept, which the real backend needs"):
        check_executable(sim.stack, sim.spec)
    with pytest.raises(MissingHookError, match=r"Residency\.advance_pages, which the simulator"):
        _built("residency=tests.test_policy_interface:PagedWithoutPages")
    with pytest.raises(FlashsimError, match=r"precision 'quantized' changes the stored weights"):
        check_executable(_built("precision=quantized").stack, open_trace(SHIPPED).spec)


def test_a_policy_without_an_abstract_hook_is_one_line_from_replay(capsys):
    assert main(["replay", "--trace", SHIPPED, "--device", "jetson-orin-nano-8gb", "--tokens", "2", "--set",
                 "predictor=tests.test_policy_interface:PredictorWithoutPredict"]) == 2
    err = capsys.readouterr().err
    assert "does not implement Predictor.predict, which every backend needs" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("prefetch", ["lookahead", "delta", "none"])
def test_the_real_backend_executes_only_the_prefetch_issue_point_it_implements(prefetch):
    from real.runtime.executor_plan import check_executable
    from traces.format import open_trace

    sim = _built("residency=window", "predictor=oracle", f"prefetch={prefetch}")
    if prefetch == "lookahead":
        with pytest.raises(FlashsimError, match=r"issues its reads at previous-layer .* use --set prefetch=delta"):
            check_executable(sim.stack, open_trace(SHIPPED).spec)
    else:
        check_executable(sim.stack, open_trace(SHIPPED).spec)


def test_the_validation_grid_covers_every_prefetch_the_real_backend_executes():
    from real.runtime.executor_plan import executes_prefetch
    from real.validation.validate_grid import PREFETCH, grid, model_grid

    executed = {n for n in registry.PREFETCHERS.names() if executes_prefetch(registry.PREFETCHERS.build(n))}
    assert executed == set(PREFETCH) == {"none", "delta"}
    for points in (grid(True), grid(False), model_grid(True), model_grid(False)):
        assert {p.prefetch for p in points} == executed


def test_builtin_policies_are_discovered_from_the_package():
    """No list of modules: every module of sim/policies is imported, so each built-in registers itself."""
    text = (ROOT / "sim" / "policies" / "registry.py").read_text()
    assert "BUILTIN_MODULES" not in text
    files = {p.stem for p in (ROOT / "sim" / "policies").glob("*.py")}
    registered = {cls.__module__.rsplit(".", 1)[-1] for reg in registry.REGISTRIES.values()
                  for cls in (reg.get(n) for n in reg.names()) if cls.__module__.startswith("sim.policies.")}
    assert registered <= files and {"window", "naive", "prefetch", "mmap", "bundling"} <= registered


# The modules that run a plan (the DES engine, its fast path and the real executor): they ask a policy
# only through the hooks of sim/policies/base.py.
BACKEND_FILES = ["sim/engine.py", "sim/fastpath.py", "sim/step_plans.py", "sim/energy.py",
                 "sim/components/pipeline.py", "real/runtime/backend.py", "real/runtime/executor_plan.py",
                 "real/runtime/cache_matrices.py", "real/runtime/shape_mode.py"]
FORBIDDEN = {
    "a policy-name comparison": re.compile(r"\b(residency|predictor|layout|prefetch|precision|res|pf)\.name\s*"
                                           r"(==|!=|in\b|not in\b)"),
    "a read of a policy's state": re.compile(r"\.state(\[|\.get\()"),
    "a parameter looked up with a default": re.compile(r"getattr\([^)]*(params|residency|layout|prefetch|"
                                                       r"predictor|precision)"),
    "a prefetch trigger string": re.compile(r"\.trigger\b|previous-(step|layer)\""),
}


@pytest.mark.parametrize("path", BACKEND_FILES)
def test_backends_ask_policies_only_through_hooks(path):
    text = (ROOT / path).read_text()
    for what, pattern in FORBIDDEN.items():
        hits = [f"{path}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}" for m in pattern.finditer(text)]
        assert not hits, f"{what}: {hits}"


def test_no_policy_state_is_read_outside_the_policy_modules():
    hits = []
    for pkg in ("sim", "real", "analysis", "flashsim"):
        for p in (ROOT / pkg).rglob("*.py"):
            rel = p.relative_to(ROOT).as_posix()
            if rel.startswith("sim/policies/"):
                continue
            hits += [f"{rel}: {m.group(0)}" for m in FORBIDDEN["a read of a policy's state"].finditer(p.read_text())]
    assert not hits
