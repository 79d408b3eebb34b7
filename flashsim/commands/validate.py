"""CLI: `flashsim validate`, a grid of configurations on the real backend scored against the simulator,
or (--rescore) kept grids replayed on another profile.

    flashsim validate [--quick] [--json] [--plot DIR] [--profile NAME|YAML] [--tokens N] [--seed S]
                      [--modes shape,model,moe] [--moe-store small|large] [--keep DIR | --rescore DIR ...]

The report's tables are flashsim/validation_output.py (shared with `flashsim calibrate`).
"""

from __future__ import annotations

import argparse

from devices.errors import FlashsimError
from flashsim.output import print_json
from flashsim.validation_output import print_rescore_many, print_validation, validate_progress

# validate's options that shape the real runs: a rescore runs none, so it refuses them rather than ignore them
KEPT_PROFILE = "kept"
RUN_OPTIONS = ("quick", "tokens", "seed", "workdir", "threads", "modes", "repeats", "check_every", "keep",
               "recalibrate_every", "moe_store")


def register(sub: argparse._SubParsersAction) -> None:
    v = sub.add_parser("validate", help="run a grid of configurations on the real backend and report the "
                                        "simulator's error against it")
    v.add_argument("--quick", action="store_true", help="a 24-configuration subset (12 shape, 8 model, 4 moe), 12 steps each")
    v.add_argument("--json", action="store_true", help="print one JSON object")
    v.add_argument("--plot", metavar="DIR", help="write a sim-vs-real scatter plot (PNG) into DIR")
    v.add_argument("--profile", default="this-host", help="device profile the simulator replays with "
                                                         "(name or YAML, e.g. one written by `flashsim bench`); "
                                                         f"with --rescore, `{KEPT_PROFILE}` replays each grid on "
                                                         "the profile it was validated with")
    v.add_argument("--tokens", type=int, help="decode steps per configuration (default 12 quick, 24 full)")
    v.add_argument("--seed", type=int, default=0, help="seed of the store, trace and compute inputs")
    v.add_argument("--workdir", help="folder for the temporary store and traces (default: system temp)")
    v.add_argument("--threads", type=int, help="PyTorch compute threads of the real runs (default: the profile's "
                                               "compute.threads, the count its rates were measured at; 1 if none)")
    v.add_argument("--modes", default="shape,model,moe",
                   help="shape (random-weight store of a small llama shape), model (SmolLM2 token by token, its real "
                        "FFN weights), moe (expert caches on an expert store of random experts); comma-separated "
                        "(default all three)")
    v.add_argument("--moe-store", default="small", choices=("small", "large"),
                   help="the moe mode's expert store: small (tens of MiB, default) or large (3 GiB of 12 MiB experts, "
                        "past the page cache; writing it takes a minute)")
    v.add_argument("--repeats", type=int, default=3,
                   help="real runs per configuration, as interleaved passes over the whole grid (default 3, also "
                        "with --quick); each pass is scored against the mean of the others, the host's repeat "
                        "spread the simulator's error is judged against (floor); 1 skips it")
    v.add_argument("--check-every", type=float, metavar="S",
                   help="seconds between the host checks that drift_corrected replays at (default 10; 0 = after "
                        "every real run, so each run sits between two checks: ~1.2 s per check)")
    v.add_argument("--recalibrate-every", type=float, metavar="S",
                   help="calibrate the host (the full bench flash + bench compute at the runs' threads, ~5 min "
                        "each, also with --quick) at the start, after every S seconds of real runs and at the end, and "
                        "score against the calibrations' mean instead of --profile (for a shared host whose speed "
                        "moves over minutes; the errors against --profile are reported too)")
    v.add_argument("--keep", metavar="DIR", help="keep the executed traces and every real run's per-token records in "
                                                 "this new folder, to score other profiles against them later (--rescore)")
    v.add_argument("--rescore", metavar="DIR", nargs="+",
                   help="run nothing: replay a grid kept with --keep on --profile and report its errors against the "
                        "kept real runs (seconds, not minutes); several DIRs: each grid's errors, their spread, and "
                        "the groups pooled over all of them")
    v.set_defaults(func=_validate, run_option_defaults={name: v.get_default(name) for name in RUN_OPTIONS})



# ---- validate -------------------------------------------------------------------------------------
def _validate(args: argparse.Namespace) -> int:
    from devices import load_profile
    from real.validation.validate import run_validation
    from real.validation.validate_grid import parse_modes

    if args.tokens is not None and args.tokens < 4:
        raise FlashsimError(f"--tokens {args.tokens}: need at least 4 steps (2 are warm-up)")
    if args.threads is not None and args.threads < 1:
        raise FlashsimError(f"--threads {args.threads}: give at least 1 compute thread (or omit it: the profile's count)")
    if args.repeats < 1:
        raise FlashsimError(f"--repeats {args.repeats}: give 1 or more real runs per configuration")
    if args.rescore is not None:
        return _rescore(args)
    modes = parse_modes(args.modes)
    if args.keep is not None and "moe" in modes:
        raise FlashsimError("--keep: a kept grid holds the dense modes' runs only (--rescore replays the dense "
                            "simulator); add --modes shape,model (or shape / model) to keep one")
    if args.profile == KEPT_PROFILE:
        raise FlashsimError(f"--profile {KEPT_PROFILE}: only with --rescore DIR (the profile a kept grid was "
                            "validated with); give a profile name or YAML file")
    profile = load_profile(args.profile)
    report = run_validation(profile, quick=args.quick, tokens=args.tokens, seed=args.seed, workdir=args.workdir,
                            progress=validate_progress(args.json), threads=args.threads, modes=modes,
                            repeats=args.repeats, check_every_s=args.check_every, keep=args.keep,
                            recalibrate_every_s=args.recalibrate_every, moe_store=args.moe_store)
    return print_validation(report, args.json, args.plot)


def _rescore(args: argparse.Namespace) -> int:
    from devices import load_profile
    from real.validation.validate_keep import rescore

    given = [name for name, default in args.run_option_defaults.items() if getattr(args, name) != default]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise FlashsimError(f"{flag} with --rescore: a rescore runs nothing, it replays the kept grid as it ran; "
                            f"drop {flag}")
    # `--profile kept`: each grid on the profile it was validated with (its profile.yaml)
    profile = None if args.profile == KEPT_PROFILE else load_profile(args.profile)
    if len(args.rescore) == 1:
        report = rescore(args.rescore[0], profile, progress=validate_progress(args.json))
        return print_validation(report, args.json, args.plot)
    if args.plot:
        raise FlashsimError("--plot with several --rescore folders: plot one kept grid at a time "
                            "(flashsim validate --rescore DIR --plot OUT)")
    from real.validation.validate_keep import rescore_many

    many = rescore_many(args.rescore, profile, progress=validate_progress(args.json))
    if args.json:
        print_json(many)
        return 0
    print_rescore_many(many)
    return 0


