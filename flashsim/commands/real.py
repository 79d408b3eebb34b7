"""`flashsim real`: the real backend's weight store and storage tools.

    real convert   a Hugging Face model (or a ModelSpec's shape with random weights) -> weight store
    real info      what a store holds
    real verify    check every file's size, alignment and SHA-256
    real read      read random neuron sets through the direct-I/O reader (throughput, chunk sizes)
    real mmap      the OS demand-paging baseline: dense FFN over mmapped weights under a page-cache budget
    real quant-quality  int8/int4 weights (+ oracle top-k FFN) on the real model: perplexity, agreement

Later sub-commands (model and shape runs, predictor training) join the same `real` parser here.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from devices.errors import FlashsimError
from devices.limits import MAX_READ_CALLS, READER_THREADS, check_cli, check_size
from devices.units import format_bytes, format_rate, parse_bytes
from flashsim.output import print_json, print_table
from real.studies.predictor_train import (  # NumPy only
    DEFAULT_EPOCHS,
    DEFAULT_HOLDOUT,
    DEFAULT_LR,
    DEFAULT_RANK,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("real", help="real backend: weight stores, direct-I/O reads, mmap baseline")
    rsub = p.add_subparsers(dest="real_cmd", metavar="SUBCOMMAND")
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])

    c = rsub.add_parser("convert", help="write a weight store from a model, or random weights of a shape")
    src = c.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="smollm2-135m, a Hugging Face model folder, or a FILE.gguf")
    src.add_argument("--shape", help="shape mode: a bundled model spec name or config (random weights)")
    c.add_argument("--random", action="store_true", help="shape mode: confirm random weights (required with --shape)")
    c.add_argument("--seed", type=int, default=0, help="shape mode: seed of the random weights (default 0)")
    c.add_argument("--out", required=True, help="the store directory to create")
    c.add_argument("--dtype", choices=["fp32", "fp16", "bf16"], help="stored dtype (default fp32 for --model, fp16 for --shape)")
    c.add_argument("--order", choices=["original", "hot-first"], default="original", help="neuron order on disk")
    c.add_argument("--profile", help="with --order hot-first: a neuron profile .npz (`flashsim trace profile`)")
    c.add_argument("--profile-task", help="rank by this task's base ranking instead of the model-wide one")
    c.add_argument("--layout", choices=["bundled", "unbundled", "both"], default="bundled",
                   help="bundled (gate|up|down per neuron), unbundled (one region per matrix), or both")
    c.add_argument("--alignment", choices=["padded", "packed"], default="padded",
                   help="padded: every bundle/row on a 4 KiB boundary (default); packed: back to back")
    c.add_argument("--files", choices=["per-layer", "single"], default="per-layer", help="one file per layer, or one file")
    c.add_argument("--overwrite", action="store_true", help="replace an existing store at --out")
    c.add_argument("--json", action="store_true", help="print the store summary as JSON")
    c.set_defaults(func=_convert)

    i = rsub.add_parser("info", help="show what a weight store holds")
    i.add_argument("store")
    i.add_argument("--json", action="store_true")
    i.set_defaults(func=_info)

    v = rsub.add_parser("verify", help="check a store's files: sizes, alignment, SHA-256 checksums")
    v.add_argument("store")
    v.add_argument("--json", action="store_true")
    v.set_defaults(func=_verify)

    r = rsub.add_parser("read", help="read random neuron sets through the direct-I/O reader and report throughput")
    r.add_argument("store")
    r.add_argument("--layout", choices=["bundled", "unbundled"], default="bundled")
    r.add_argument("--fraction", type=float, default=0.1, help="share of a layer's neurons per read (default 0.1)")
    r.add_argument("--run", type=int, default=0, help="neurons per run of adjacent slots, runs separated by a gap "
                   "(0: uniformly random neurons; default)")
    r.add_argument("--tokens", type=int, default=10, help="tokens; each reads every layer once (default 10)")
    r.add_argument("--in-flight", type=int, default=8, help="reads in flight (threads; default 8)")
    r.add_argument("--max-chunk", default="1MiB", help="largest coalesced read (default 1MiB)")
    r.add_argument("--buffered", action="store_true", help="buffered reads + page-cache eviction instead of O_DIRECT")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=_read)

    m = rsub.add_parser("mmap", help="the OS demand-paging baseline: dense FFN over mmapped weights under a budget")
    m.add_argument("store")
    m.add_argument("--budget", required=True, help="page-cache budget for the FFN: bytes (e.g. 64MiB) or a share (50%%)")
    m.add_argument("--tokens", type=int, default=5)
    m.add_argument("--advice", choices=["normal", "random", "sequential"], default="normal", help="madvise for the mapping")
    m.add_argument("--layout", choices=["bundled", "unbundled"], help="default: unbundled when the store has it")
    m.add_argument("--framework", choices=["auto", "torch", "numpy"], default="auto")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=_mmap)

    from flashsim.commands import real_quant

    real_quant.register(rsub)
    t = rsub.add_parser("train-predictor", help="train the low-rank activation predictor (LLM in a flash) and report "
                                                "its held-out recall and precision")
    t.add_argument("--model", required=True, help="smollm2-135m or a llama-family Hugging Face model folder")
    t.add_argument("--prompts", default="builtin", help="prompt file (JSON lines, as `flashsim capture`; default builtin)")
    t.add_argument("--limit-prompts", type=int, help="use only the first N prompts")
    t.add_argument("--max-new-tokens", type=int, default=0,
                   help="greedy tokens generated after each prompt and added to the data (default 0: prompt tokens only)")
    t.add_argument("--no-chat-template", action="store_true",
                   help="feed the prompts' plain text (default: the chat template, as capture does); the predictor "
                        "learns the distribution it is trained on, so match what it will predict for")
    t.add_argument("--rank", type=int, default=DEFAULT_RANK, help=f"rank r of A [d, r] and B [r, N] (default {DEFAULT_RANK})")
    t.add_argument("--epochs", type=int, default=DEFAULT_EPOCHS, help=f"passes over the training tokens (default {DEFAULT_EPOCHS})")
    t.add_argument("--lr", type=float, default=DEFAULT_LR, help=f"Adam learning rate (default {DEFAULT_LR:g})")
    t.add_argument("--sparsity", help="activity rule of the labels: threshold:F, topk:F or relu (default: capture's "
                                      "default for the model, threshold:0.5 for SwiGLU)")
    t.add_argument("--threshold", type=float, default=0.5, help="predicted active when sigmoid >= this (default 0.5)")
    t.add_argument("--holdout", type=float, default=DEFAULT_HOLDOUT,
                   help=f"share of the prompts held out for recall/precision (default {DEFAULT_HOLDOUT:g})")
    t.add_argument("--seed", type=int, default=0, help="seed of the split, the initial weights and the minibatches")
    t.add_argument("--threads", type=int, default=1,
                   help="PyTorch threads (default 1: on cores shared with other work every multi-threaded op waits "
                        "for a descheduled worker; 1 also makes results host-independent)")
    t.add_argument("--out", required=True, help="predictor file to write (.safetensors)")
    t.add_argument("--json", action="store_true", help="print the metadata (with recall/precision) as JSON")
    t.set_defaults(func=_train_predictor)
    __import__("flashsim.commands.real_run", fromlist=["register_real"]).register_real(rsub)  # `real run` (real_run.py)
    __import__("flashsim.commands.real_moe", fromlist=["register_store"]).register_store(rsub)  # `real moe-store`
    __import__("flashsim.commands.real_predictor_errors", fromlist=["register_real"]).register_real(rsub)  # `real predictor-errors`


# ---- convert, info, verify ---------------------------------------------------------------------------
def _convert(args: argparse.Namespace) -> int:
    from real.weights.convert import convert_model, write_shape_store
    from real.weights.store import open_store

    common: dict[str, Any] = dict(layout=args.layout, alignment=args.alignment, file_mode=args.files,
                                  order=args.order, profile=args.profile, task=args.profile_task,
                                  overwrite=args.overwrite, progress=True)
    if args.shape:
        from devices.model_spec import load_model

        if not args.random:
            raise FlashsimError("--shape writes random weights of that size: add --random (with --seed S)")
        out = write_shape_store(load_model(args.shape), args.out, seed=args.seed, dtype=args.dtype or "fp16", **common)
    else:
        if args.random:
            raise FlashsimError("--random is for --shape; --model converts the model's real weights")
        out = convert_model(args.model, args.out, dtype=args.dtype or "fp32", **common)
    return _print_store(open_store(out, verify="sizes"), args.json, "wrote")


def _print_store(store: Any, as_json: bool, verb: str) -> int:
    s = store.summary()
    if as_json:
        print_json(s)
        return 0
    print(f"{verb} {s['path']}: {s['mode']} store of {s['model']} ({s['dtype']}, {s['n_layers']} layers x "
          f"{s['n_neurons']} neurons, d_model {s['d_model']}), order {s['order']}, {s['alignment']}, {s['file_mode']}")
    rows = [[name, format_bytes(lay["unit_bytes"]), format_bytes(lay["stride_bytes"]), lay["regions_per_layer"],
             format_bytes(lay["region_bytes"] * lay["regions_per_layer"])] for name, lay in s["layouts"].items()]
    print_table(["layout", "unit", "stride", "regions/layer", "per layer"], rows, align="lrrrr")
    print(f"FFN files {format_bytes(s['ffn_file_bytes'])}, all files {format_bytes(s['total_file_bytes'])}; "
          f"resident tensors {'complete' if s['resident_complete'] else 'partial (shape mode)'}")
    return 0


def _info(args: argparse.Namespace) -> int:
    from real.weights.store import open_store

    return _print_store(open_store(args.store, verify="sizes"), args.json, "store")


def _verify(args: argparse.Namespace) -> int:
    from real.weights.store import open_store

    store = open_store(args.store, verify="full")
    n, total = len(store.manifest.files), sum(f.bytes for f in store.manifest.files.values())
    if args.json:
        print_json({"path": str(store.path), "ok": True, "files": n, "bytes": total})
    else:
        print(f"{store.path}: OK ({n} files, {format_bytes(total)}, sizes, alignment and SHA-256 checked)")
    return 0


# ---- read ------------------------------------------------------------------------------------------------
def neuron_sets(store: Any, layer: int, fraction: float, run: int, rng: np.random.Generator) -> np.ndarray:
    """Neuron ids to read: `fraction` of the layer, uniformly random (run = 0) or as runs of `run`
    adjacent slots with at least one free slot between runs (each run is one read)."""
    N = store.n_neurons
    k = max(1, int(round(fraction * N)))
    if run <= 0:
        return np.sort(rng.choice(N, min(k, N), replace=False))
    n_blocks = N // (run + 1)
    n_runs = min(n_blocks, max(1, k // run))
    blocks = np.sort(rng.choice(n_blocks, n_runs, replace=False))
    slots = (blocks[:, None] * (run + 1) + np.arange(run)[None, :]).ravel()
    return store.neuron_at[layer][slots].astype(np.int64)


MAX_CHUNK_BYTES = 1 << 30     # one coalesced read; no device gains past a few MiB


def _read(args: argparse.Namespace) -> int:
    from real.io.reader import BundleReader
    from real.runtime.cache_matrices import LayerCache
    from real.weights.store import ALIGN_BYTES, open_store

    if not 0 < args.fraction <= 1:
        raise FlashsimError(f"--fraction must be in (0, 1], got {args.fraction}")
    if args.tokens < 1 or args.in_flight < 1:
        raise FlashsimError("--tokens and --in-flight must be >= 1")
    check_cli("--in-flight", args.in_flight, READER_THREADS)
    store = open_store(args.store, verify="record")
    check_size("--tokens x the store's layers (read calls)", args.tokens * store.n_layers, MAX_READ_CALLS,
               "use fewer --tokens")
    if not 0 <= args.run < store.n_neurons:    # a run as long as the layer leaves no room for a gap: 0 neurons
        raise FlashsimError(f"--run {args.run}: must be >= 0 and < the store's {store.n_neurons} neurons per layer "
                            "(0: scattered neurons)")
    rng = np.random.default_rng(args.seed)
    max_chunk = parse_bytes(args.max_chunk, "--max-chunk")
    if not ALIGN_BYTES <= max_chunk <= MAX_CHUNK_BYTES:   # reads are whole 4 KiB blocks
        raise FlashsimError(f"--max-chunk {args.max_chunk}: must be >= {format_bytes(ALIGN_BYTES)} (one block of a "
                            f"read) and <= {format_bytes(MAX_CHUNK_BYTES)}")
    with BundleReader(store, layout=args.layout, in_flight=args.in_flight, max_chunk_bytes=max_chunk,
                      direct=False if args.buffered else None) as reader:
        capacity = min(store.n_neurons, int(round(args.fraction * store.n_neurons)) + max(1, args.run))
        cache = LayerCache(capacity, store.n_neurons, store.bundle_bytes, reader.dest_row_bytes)
        stats = []
        for _ in range(args.tokens):
            for layer in range(store.n_layers):
                ids = store.sort_by_position(layer, neuron_sets(store, layer, args.fraction, args.run, rng))
                start, stop = cache.append(ids)
                stats.append(reader.read(layer, ids, cache.rows[start:stop]))
                cache.clear()
        desc = reader.describe()
    seconds = sum(s.seconds for s in stats)
    nbytes = sum(s.bytes_read for s in stats)
    chunks = np.concatenate([s.chunk_bytes for s in stats])
    out = {**desc, "store": str(store.path), "tokens": args.tokens, "layers": store.n_layers, "calls": len(stats),
           "neurons_per_call": float(np.mean([s.neurons for s in stats])), "reads": int(len(chunks)),
           "bytes_read": int(nbytes), "bytes_useful": int(sum(s.bytes_useful for s in stats)),
           "bytes_copied": int(sum(s.bytes_copied for s in stats)), "seconds": seconds,
           "bytes_per_s": nbytes / seconds if seconds > 0 else 0.0,
           "chunk_bytes_median": float(np.median(chunks)) if len(chunks) else 0.0,
           "chunk_bytes_mean": float(chunks.mean()) if len(chunks) else 0.0,
           "seconds_per_call_median": float(np.median([s.seconds for s in stats]))}
    if args.json:
        print_json(out)
        return 0
    mode = "direct I/O" if out["direct_io"] else f"BUFFERED ({out['fallback_reason'] or '--buffered'})"
    print(f"{store.path}: {out['calls']} reads of {out['neurons_per_call']:.0f} neurons ({args.layout}, {mode}, "
          f"{args.in_flight} in flight, chunks up to {format_bytes(max_chunk)})")
    print(f"  {out['reads']} reads, median chunk {format_bytes(out['chunk_bytes_median'])}, "
          f"{format_bytes(nbytes)} read ({format_bytes(out['bytes_useful'])} useful, "
          f"{format_bytes(out['bytes_copied'])} copied) in {seconds:.3f} s: {format_rate(out['bytes_per_s'])}")
    return 0


# ---- mmap ------------------------------------------------------------------------------------------------
def _mmap(args: argparse.Namespace) -> int:
    from real.runtime.mmap_baseline import MmapFfnBaseline
    from real.weights.store import open_store

    store = open_store(args.store, verify="record")
    layout = args.layout or ("unbundled" if "unbundled" in store.layouts else "bundled")
    info = store.layout(layout)
    ffn_bytes = info.region_bytes * info.regions_per_layer * store.n_layers
    text = args.budget.strip()
    if text.endswith("%"):
        try:
            share = float(text[:-1]) / 100
        except ValueError:
            raise FlashsimError(f"--budget {args.budget}: give bytes (64MiB) or a share (50%)") from None
        if not 0 <= share <= 1:       # NaN fails this too
            raise FlashsimError(f"--budget {args.budget}: a share must be between 0% and 100% of the FFN")
        budget = int(share * ffn_bytes)
    else:
        budget = parse_bytes(text, "--budget")
    if args.tokens < 1:
        raise FlashsimError("--tokens must be >= 1")
    with MmapFfnBaseline(store, budget, layout=layout, advice=args.advice, framework=args.framework) as b:
        recs = [r.to_dict() for r in b.run(args.tokens, seed=args.seed)]
        fw = b.framework
    out = {"store": str(store.path), "layout": layout, "framework": fw, "budget_bytes": budget,
           "ffn_bytes": ffn_bytes, "advice": args.advice, "tokens": recs,
           "ms_per_token_median": float(np.median([r["seconds"] for r in recs]) * 1e3)}
    if args.json:
        print_json(out)
        return 0
    print(f"{store.path}: dense FFN over mmap ({layout}, {fw}), page-cache budget {format_bytes(budget)} "
          f"of {format_bytes(ffn_bytes)}")
    rows = [[r["token"], f"{r['seconds'] * 1e3:.1f}", r["major_faults"],
             format_bytes(r["storage_read_bytes"]) if r["storage_read_bytes"] is not None else "n/a",
             format_bytes(r["evicted_bytes"]), format_bytes(r["resident_bytes"])] for r in recs]
    print_table(["token", "ms", "major faults", "read from disk", "evicted", "resident (mincore)"], rows, align="rrrrrr")
    return 0


# ---- train-predictor -----------------------------------------------------------------------------------
def _train_predictor(args: argparse.Namespace) -> int:
    import sys
    import time

    from real.studies.predictor_train import check_settings, save_predictor, train_on_prompts
    from traces.capture.models import load_hf_model
    from traces.capture.prompts import load_prompts
    from traces.sparsity import parse_rule

    if not str(args.out).endswith(".safetensors"):
        raise FlashsimError(f"--out {args.out}: the predictor file must end in .safetensors")
    if args.threads is not None and args.threads < 1:
        raise FlashsimError(f"--threads {args.threads}: must be >= 1")
    prompts = load_prompts(args.prompts, args.limit_prompts)
    check_settings(rank=args.rank, epochs=args.epochs, threshold=args.threshold, holdout=args.holdout,
                   n_prompts=len(prompts))
    if args.sparsity:
        parse_rule(args.sparsity)
    t0 = time.perf_counter()

    def note(m: str) -> None:
        if not args.json:
            print(f"note: {m}", file=sys.stderr, flush=True)

    import torch

    before = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        loaded = load_hf_model(args.model, notify=note)
        pred = train_on_prompts(loaded, prompts, rank=args.rank, epochs=args.epochs, seed=args.seed,
                                sparsity=args.sparsity, threshold=args.threshold, holdout=args.holdout,
                                max_new_tokens=args.max_new_tokens, lr=args.lr, prompts_source=str(args.prompts),
                                progress=note, chat_template=not args.no_chat_template)
    finally:
        torch.set_num_threads(before)
    pred.meta["total_s"] = time.perf_counter() - t0
    pred.meta["torch_threads"] = args.threads
    path = save_predictor(pred, args.out)
    m = pred.meta
    if args.json:
        print_json({"path": str(path), **m})
        return 0
    ho = m["heldout"]
    per = ho["per_layer"]
    print(f"wrote {path}: {m['model']} low-rank predictor, rank {m['rank']}, threshold {m['threshold']:g}, rule "
          f"{m['sparsity']}; {m['train_tokens']} training tokens ({len(m['train_prompts'])} prompts), "
          f"{m['heldout_tokens']} held-out tokens ({len(m['heldout_prompts'])} prompts); trained in {m['training_s']:.1f} s")
    rows = [[r["layer"], f"{r['recall']:.3f}", f"{r['precision']:.3f}", f"{r['predicted_fraction']:.3f}",
             f"{r['active_fraction']:.3f}"] for r in per]
    o = ho["overall"]
    rows.append(["all", f"{o['recall']:.3f}", f"{o['precision']:.3f}", f"{o['predicted_fraction']:.3f}",
                 f"{o['active_fraction']:.3f}"])
    print_table(["layer", "recall", "precision", "predicted", "active"], rows, align="rrrrr")
    pers = m.get("heldout_persistence")
    if pers and pers["fp_persistence"] and pers["fp_persistence"][0] is not None:
        print(f"errors repeating at the next held-out token: false positives {pers['fp_persistence'][0]:.3f} "
              f"(rate {pers['fp_rate']:.3f}), misses {pers['fn_persistence'][0]:.3f} (rate {pers['fn_rate']:.3f}); "
              "per layer and lag: `flashsim real predictor-errors`")
    own = m.get("heldout_own")
    if own and m["shared_prefix_tokens"]:
        o = own["overall"]
        print(f"held-out tokens past the {m['shared_prefix_tokens']}-token prefix all prompts share "
              f"({m['heldout_own_tokens']} tokens): recall {o['recall']:.3f}, precision {o['precision']:.3f}, "
              f"predicted {o['predicted_fraction']:.3f}")
    return 0
