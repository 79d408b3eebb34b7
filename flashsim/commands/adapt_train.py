"""`flashsim adapt train`: train the learned RAP controller (DQN) and write its weights (safetensors).

Builds `adapt.env.RapEnv` from a model's block bytes (`sim.blocks.BlockMemory`) and a GSI file
(importances and the log-perplexity estimate), trains with `adapt.train.train_dqn`, writes the
weights atomically, and then scores the trained policy and the GSI-order heuristic
(`adapt.controllers.heuristic`) on `--eval-points` held-out decision points drawn from a seed
stream the training never uses. Bad input (unknown model, a missing or mismatched GSI file, --steps < 1,
an --out folder that does not exist) fails with one line and exit 2 before training.
"""

from __future__ import annotations

import argparse
import hashlib
from typing import Any

import numpy as np

from devices.errors import FlashsimError
from devices.progress import Stage
from flashsim.output import output_file, print_json, print_table

DEFAULT_STEPS = 150_000      # = adapt.train.DqnConfig().steps
DEFAULT_EVAL_POINTS = 300
DEFAULT_VISIT = "importance"   # with the full GSI file: held-out 0.7414 vs 0.7345 per byte (docs/adapt.md)
# Held-out decision points come from this seed's stream, never from a training seed's stream
# (training seeds spawn from SeedSequence(seed); this one is a different root entropy).
HELD_OUT_SEED = 2026_11_29


def register(asub: argparse._SubParsersAction) -> None:
    from adapt.controllers.learned_obs import VISITS
    from adapt.env import DEFAULT_ALPHA, DEFAULT_BETA

    p = asub.add_parser(
        "train", help="train the learned controller (DQN, NumPy) in the Gymnasium environment",
        description="Train the learned RAP controller: a DQN with a 15-128-128-2 MLP (18,818 "
        "parameters) over sequential keep/drop decisions, reward alpha*quality_kept - "
        "beta*memory_penalty (docs/adapt.md). Writes safetensors weights.")
    p.add_argument("--model", default="smollm2-135m", help="model name or config (default smollm2-135m)")
    p.add_argument("--gsi", metavar="FILE", help="GSI file (`flashsim adapt gsi`); default: the shipped "
                   "adapt/data/<model>.gsi.json")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, metavar="N",
                   help=f"environment steps (keep/drop decisions) to train (default {DEFAULT_STEPS})")
    p.add_argument("--seed", type=int, default=0, help="training seed (default 0)")
    p.add_argument("--alpha", type=float, default=DEFAULT_ALPHA, help=f"quality weight (default {DEFAULT_ALPHA})")
    p.add_argument("--beta", type=float, default=DEFAULT_BETA, help=f"memory-penalty weight (default {DEFAULT_BETA})")
    p.add_argument("--visit", choices=VISITS, default=DEFAULT_VISIT,
                   help=f"order the pass visits blocks in: ascending importance, or ascending importance "
                   f"per byte freed (default {DEFAULT_VISIT})")
    p.add_argument("--eval-points", type=int, default=DEFAULT_EVAL_POINTS, metavar="K",
                   help=f"held-out decision points scored after training (default {DEFAULT_EVAL_POINTS}; 0: skip)")
    p.add_argument("--out", required=True, metavar="FILE.safetensors", help="weights file to write")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.set_defaults(func=_train)


def build_env(model: str, gsi: str | None, alpha: float, beta: float,
              visit: str = DEFAULT_VISIT) -> tuple[Any, dict[str, Any], str]:
    """(RapEnv, GSI document, sha256 of the GSI file) for a model; FlashsimError on bad input."""
    from adapt.drop_quality import GsiPerplexity
    from adapt.env import RapEnv
    from adapt.importance import check_names, gsi_path_for, importance_vector, read_gsi_file
    from devices import load_model
    from sim.blocks import BlockMemory

    spec = load_model(model)
    path = gsi_path_for(spec.name, gsi)
    doc = read_gsi_file(path)
    blocks = BlockMemory.from_spec(spec)
    check_names(doc, blocks.names, where=f"--gsi {path}")
    if alpha < 0 or beta < 0:
        raise FlashsimError(f"--alpha {alpha} / --beta {beta}: both must be >= 0")
    env = RapEnv(blocks, importance_vector(doc, blocks.names), GsiPerplexity(doc, blocks.names),
                 alpha=alpha, beta=beta, visit=visit)
    return env, doc, hashlib.sha256(path.read_bytes()).hexdigest()


def held_out_states(env: Any, k: int, seed: int = HELD_OUT_SEED) -> list[Any]:
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    return [env.sample_state(rng) for _ in range(k)]


def compare(env: Any, params: dict[str, np.ndarray], states: list[Any]) -> dict[str, dict[str, float]]:
    """Mean score, quality kept, violations (and safety-rule firings) of the learned policy and the
    heuristics on the same decision points."""
    from adapt.controllers.heuristic import Heuristic
    from adapt.controllers.learned import (
        CompiledPolicy,
        apply_safety,
        decide_pass,
        single_thread_blas,
    )
    from adapt.controllers.learned_obs import pass_context

    out: dict[str, dict[str, float]] = {}
    rows: dict[str, list[dict[str, Any]]] = {"learned": [], "heuristic": [], "heuristic-bytes": []}
    fired = 0
    heur = {"heuristic": Heuristic("importance"), "heuristic-bytes": Heuristic("per-byte")}
    policy = CompiledPolicy.from_params(params)
    with single_thread_blas():
        for s in states:
            d, f = apply_safety(s, decide_pass(policy, pass_context(s, env.visit)))
            fired += int(f)
            rows["learned"].append(env.plan_score(s, d))
            for name, h in heur.items():
                rows[name].append(env.plan_score(s, h.decide(s)))
    for name, rs in rows.items():
        out[name] = {
            "score": float(np.mean([r["score"] for r in rs])),
            "quality_kept": float(np.mean([r["quality_kept"] for r in rs])),
            "violations": int(sum(r["violation"] for r in rs)),
            "mean_dropped": float(np.mean([r["n_dropped"] for r in rs])),
        }
    out["learned"]["safety_fired"] = fired
    out["learned"]["wins"] = int(sum(a["score"] > b["score"] + 1e-12
                                     for a, b in zip(rows["learned"], rows["heuristic"])))
    out["learned"]["losses"] = int(sum(a["score"] < b["score"] - 1e-12
                                       for a, b in zip(rows["learned"], rows["heuristic"])))
    return out


def _train(args: argparse.Namespace) -> int:
    from adapt.train import DqnConfig, policy_metadata, save_policy, train_dqn

    if args.steps < 1:
        raise FlashsimError(f"--steps {args.steps}: must be >= 1")
    if args.eval_points < 0:
        raise FlashsimError(f"--eval-points {args.eval_points}: must be >= 0")
    if args.seed < 0:
        raise FlashsimError(f"--seed {args.seed}: must be >= 0")
    out = output_file(args.out, "FILE.safetensors")
    env, doc, gsi_sha = build_env(args.model, args.gsi, args.alpha, args.beta, args.visit)
    config = DqnConfig(steps=args.steps, seed=args.seed)

    with Stage("adapt train", args.steps, "steps") as stage:
        def progress(step: int, mean_score: float) -> None:
            stage.set_postfix(f"mean episode score {mean_score:.4f}")
            stage.update(step - stage.n)

        result = train_dqn(env, config, progress=progress)
        stage.update(args.steps - stage.n)
    meta = policy_metadata(result, alpha=args.alpha, beta=args.beta, model=str(doc["model"].get("name")),
                           gsi_sha256=gsi_sha)
    save_policy(out, result.params, meta)
    summary: dict[str, Any] = {
        "out": str(out), "metadata": meta, "n_params": int(meta["n_params"]),
        "train_s": round(result.seconds, 2), "episodes": result.episodes, "updates": result.updates,
        "mean_score_last": result.mean_score_last,
    }
    if args.eval_points:
        summary["held_out"] = {"points": args.eval_points, "seed": HELD_OUT_SEED,
                               **compare(env, result.params, held_out_states(env, args.eval_points))}
    if args.json:
        print_json(summary)
        return 0
    print(f"trained {meta['n_params']} parameters ({meta['hidden']} hidden) for {args.steps} steps "
          f"({result.episodes} episodes, {result.updates} updates) in {result.seconds:.1f} s")
    if args.eval_points:
        h = summary["held_out"]
        print(f"held-out: {args.eval_points} decision points (seed {HELD_OUT_SEED}); learned beats the "
              f"heuristic on {h['learned']['wins']}, loses on {h['learned']['losses']}; safety rule "
              f"fired {h['learned']['safety_fired']} times")
        rows = [(name, f"{h[name]['score']:.4f}", f"{h[name]['quality_kept']:.4f}", h[name]["violations"],
                 f"{h[name]['mean_dropped']:.1f}") for name in ("learned", "heuristic", "heuristic-bytes")]
        print_table(["controller", "score", "quality_kept", "violations", "mean_dropped"], rows, align="lrrrr")
    print(f"wrote {out}")
    return 0
