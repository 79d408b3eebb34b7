"""Trace analysis speed at 7B scale: statistics and synthesis of a 1,000-token trace.

Targets (issue 3): `trace stats` of a 7B-shape (32 layers x 11008 neurons) 1,000-token trace in
<= 2 s; synthesis of such a trace in <= 10 s. Also printed: the Llama-3-8B shape (14336 neurons),
synthesis fitted to a source (--like), and the end-to-end CLI (`open_trace` with checksum and NaN
verification, then the statistics). Each is timed REPEATS times in one run and the best and median
are printed next to the target as a ratio (below 1 = within target). Nothing is asserted as a time.
Run with `make bench` (about a minute).
"""

from __future__ import annotations

import statistics
import time

import pytest

from devices import load_model
from traces.format import open_trace
from traces.stats import trace_stats
from traces.synthetic import synthesize

REPEATS = 3
TOKENS = 1000


def _timed(fn, repeats: int = REPEATS) -> tuple[float, float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def _line(what: str, best: float, median: float, target: float) -> str:
    return (f"{what:58s} best {best:6.2f} s  median {median:6.2f} s  target {target:4.1f} s  "
            f"ratio {median / target:4.2f}")


@pytest.mark.parametrize("model", ["llama-2-7b", "llama-3-8b"])
def test_bench_stats_and_synthesis(tmp_path, model):
    spec = load_model(model)
    n = [0]

    def synth():
        n[0] += 1
        synthesize(tmp_path / f"syn{n[0]}", spec, TOKENS, seed=n[0], active_fraction=0.1, overlap=0.5,
                   hot_skew=0.5)

    s_best, s_med = _timed(synth)
    trace = open_trace(tmp_path / "syn1", verify=False)
    st_best, st_med = _timed(lambda: trace_stats(trace))
    cli_best, cli_med = _timed(lambda: trace_stats(open_trace(tmp_path / "syn1")))
    like_best, like_med = _timed(lambda: synthesize(tmp_path / "like", spec, TOKENS, seed=1, like=trace,
                                                     overwrite=True), repeats=1)
    shape = f"{spec.n_layers} x {spec.d_ff} x {TOKENS} tokens, top-K {trace.top_k}"
    print(f"\n{model} ({shape})")
    print(_line("synthesis, parameters (F 0.1, P 0.5, H 0.5)", s_best, s_med, 10.0))
    print(_line("synthesis --like (fit to a trace of this shape)", like_best, like_med, 10.0))
    print(_line("stats (trace already open)", st_best, st_med, 2.0))
    print(_line("stats incl. open_trace with verification (the CLI)", cli_best, cli_med, 2.0))


LLAMA3_70B = {"model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
              "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256, "hidden_act": "silu",
              "tie_word_embeddings": False}


def test_bench_planning_trace_synthesis(tmp_path):
    """Issue 55.1: the synthetic trace `flashsim plan` makes for a model with no trace of its own
    (analysis/plan_setup.py: 128 decode tokens, seed 0, fitted to the shipped SmolLM2 trace for
    SwiGLU models, with magnitudes), for Llama-3.2-3B, Mistral-7B and a Llama-3-70B shape; and the
    70B-shape replay trace of tests/benchmarks/test_bench_noisy_memory.py (512 tokens, ReLU-like
    parameters, no magnitudes). Target: the 3B trace in <= 0.5 s, the others in proportion to their
    cells (layers x neurons x tokens). Wall and CPU seconds, best of two; nothing is asserted."""
    from analysis.plan_setup import DEFAULT_PLAN_TOKENS
    from devices.model_spec import ModelSpec
    from traces.data import shipped_trace_path

    source = open_trace(shipped_trace_path())
    specs = [load_model("llama-3.2-3b"), load_model("mistral-7b"),
             ModelSpec.from_hf_config(LLAMA3_70B, "llama-3-70b-shape")]
    cases = [(s, DEFAULT_PLAN_TOKENS, {"like": source}) for s in specs]
    cases.append((specs[2], 512, {"active_fraction": 0.03, "overlap": 0.7, "hot_skew": 0.25, "magnitudes": False}))
    base_cells = specs[0].n_layers * specs[0].d_ff * DEFAULT_PLAN_TOKENS
    n = [0]
    for spec, tokens, kw in cases:
        def synth(spec=spec, tokens=tokens, kw=kw):
            n[0] += 1
            synthesize(tmp_path / f"p{n[0]}", spec, tokens, 0, **kw)

        cpu = []
        wall = []
        for _ in range(2):
            c0 = time.process_time()
            wall.append(_timed(synth, repeats=1)[0])
            cpu.append(time.process_time() - c0)
        what = f"{spec.name} ({spec.n_layers} x {spec.d_ff}, {tokens} tokens, {'like' if 'like' in kw else 'params'})"
        line = f"\n{what:58s} wall {min(wall):6.2f} s  CPU {min(cpu):6.2f} s"
        if "like" in kw:                  # a planning trace: the target scales with the cells
            target = 0.5 * spec.n_layers * spec.d_ff * tokens / base_cells
            line += f"  target {target:5.2f} s  ratio {min(wall) / target:4.2f}"
        print(line)
