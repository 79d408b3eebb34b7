"""`flashsim replay`: simulate one model on one device under one policy configuration, on a trace.

    flashsim replay --trace DIR --device NAME --preset NAME [--model NAME] [--set key=value ...]
                    [--dram-budget 4GiB] [--budget-timeline FILE] [--tokens N] [--batch B] [--seed S]
                    [--rescale] [--engine auto|des|fast] [--json] [--records FILE.parquet]
                    [--timeline FILE.json]
    flashsim replay --list-params [--preset NAME] [--json]

Prints the summary (decode figures; prefill apart) as a table, or one JSON object with `--json`;
both carry the energy per token and its components (joules_per_token, energy_mj_per_token) where the
device profile has an energy section (docs/energy.md).
`--records` writes the per-token records as Parquet, `--timeline` a Chrome/Perfetto trace
(open it at ui.perfetto.dev). Bad input: one line on stderr, exit code 2.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from devices.errors import FlashsimError
from devices.units import UNITS_NOTE, format_bytes, format_rate, parse_bytes
from flashsim.output import output_file, print_json, print_table
from sim.metric_names import (
    ACTIVATION_MASS_KEPT,
    COMPUTE_MS_PER_TOKEN,
    DRAM_PEAK_BYTES,
    ENERGY_MJ_PER_TOKEN,
    FLASH_BYTES_PER_TOKEN,
    FLASH_READS_PER_TOKEN,
    FLASH_THROUGHPUT_BYTES_PER_S,
    IO_MS_PER_TOKEN,
    JOULES_PER_TOKEN,
    LATENCY_P50_MS,
    LATENCY_P90_MS,
    MEMORY_MGMT_MS_PER_TOKEN,
    MS_PER_TOKEN,
    RECALL,
    STALL_MS_PER_TOKEN,
    TOKENS_PER_S,
)

ENGINES = ("auto", "des", "fast")
# the figures repeated at the datasheet ceiling (`peak_bound` in --json) and with perfect policies
# (`ideal_policy_bound`) beside the expected ones
PEAK_KEYS = (TOKENS_PER_S, MS_PER_TOKEN, IO_MS_PER_TOKEN, COMPUTE_MS_PER_TOKEN, STALL_MS_PER_TOKEN,
             FLASH_THROUGHPUT_BYTES_PER_S, FLASH_BYTES_PER_TOKEN)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help="simulate a trace on a device under a policy preset",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", help="trace directory (see `flashsim trace`)")
    p.add_argument("--model", help="model spec to replay the trace on (default: the trace's own model)")
    p.add_argument("--device", help="device profile name or YAML path (see `flashsim devices`)")
    p.add_argument("--preset", default=None, help="policy preset (see --list-params); default llm-in-a-flash")
    p.add_argument("--config", help="a run configuration YAML/JSON (slots and sections), applied after --preset")
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                   help="override a parameter, e.g. window.k=3, prefetch=delta, workload.batch=4 (repeatable)")
    p.add_argument("--dram-budget", help="DRAM available to the model, e.g. 4GiB (default: device capacity minus reserved)")
    p.add_argument("--budget-timeline", help="JSON/CSV of (t_s, available_bytes): memory taken by co-running apps")
    p.add_argument("--tokens", type=int, help="decode steps to simulate (default: every generated token in the trace)")
    p.add_argument("--batch", type=int, help="sequences decoded together (default 1)")
    p.add_argument("--prompt-tokens", type=int, help="prompt tokens per sequence (default: the trace's prompts)")
    p.add_argument("--seed", type=int, help="seed of the random streams (default 0)")
    p.add_argument("--runtime", help="the inference runtime (kernels per layer, dispatch per op; devices/runtimes/): "
                                     "llama.cpp (default) or eager-pytorch; the same as --set compute.runtime=NAME")
    p.add_argument("--rescale", action="store_true", help="allow a trace of another shape than --model (tiled)")
    p.add_argument("--bound", choices=("achievable", "peak"), default="achievable",
                   help="device numbers: achievable (published/measured, the default) or peak (datasheet ceiling); "
                        "with achievable the peak-bound figure is printed beside it")
    p.add_argument("--engine", choices=ENGINES, default="auto",
                   help="des: discrete-event; fast: analytic (refused with timing feedback); auto: fast when valid")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--records", help="write per-token records to this Parquet file")
    p.add_argument("--timeline", help="write a Chrome/Perfetto trace of the run to this JSON file")
    p.add_argument("--list-params", action="store_true", help="document every slot, policy, parameter and preset")
    from flashsim.commands.moe_replay import add_arguments

    add_arguments(p)
    p.set_defaults(func=_run)


def _config(args: argparse.Namespace) -> Any:
    from devices.loading import read_mapping
    from sim.components.memory import load_budget_timeline
    from sim.config import apply_partial
    from sim.policies.presets import preset_config

    data = read_mapping(Path(args.config)) if args.config else {}
    preset = args.preset or (str(data["preset"]) if data.get("preset") is not None else "llm-in-a-flash")
    cfg = preset_config(preset)
    if args.config:     # only what the file names changes (a slot it restates keeps its other parameters)
        cfg = apply_partial(cfg, data, where=args.config)
    sets = list(args.settings)
    given = {item.partition("=")[0].strip() for item in sets}
    for flag, key in (("dram_budget", "memory.dram_budget_bytes"), ("tokens", "workload.tokens"),
                      ("batch", "workload.batch"), ("prompt_tokens", "workload.prompt_tokens"), ("seed", "sim.seed")):
        if getattr(args, flag) is not None and (key in given or (key == "sim.seed" and "seed" in given)):
            raise FlashsimError(f"--{flag.replace('_', '-')} and --set {key}: the same setting given twice; give one")
    if args.dram_budget is not None:
        sets.append(f"memory.dram_budget_bytes={parse_bytes(args.dram_budget, '--dram-budget')}")
    for flag, key in (("tokens", "workload.tokens"), ("batch", "workload.batch"),
                      ("prompt_tokens", "workload.prompt_tokens"), ("seed", "sim.seed"),
                      ("runtime", "compute.runtime")):
        if getattr(args, flag) is not None:
            sets.append(f"{key}={getattr(args, flag)}")
    if args.rescale:
        sets.append("sim.rescale=true")
    cfg = cfg.with_overrides(sets)
    if args.budget_timeline:
        from dataclasses import replace

        cfg = replace(cfg, budget_timeline=load_budget_timeline(args.budget_timeline))
    return cfg


def _run(args: argparse.Namespace) -> int:

    if args.list_params:
        return _list_params(args)
    from flashsim.commands.moe_replay import is_moe_replay, run_moe_replay

    if is_moe_replay(args):
        return run_moe_replay(args)
    missing = [f"--{n}" for n in ("trace", "device") if not getattr(args, n)]
    if missing:
        raise FlashsimError(f"replay: {' and '.join(missing)} required (or --list-params)")
    from devices import load_model, load_profile
    from sim.engine import build
    from traces.format import open_trace

    for option, path, kind in (("--records", args.records, "FILE.parquet"), ("--timeline", args.timeline, "FILE.json")):
        if path:
            output_file(path, kind, option)           # a directory or unwritable path: refused before any work
    cfg = _config(args)
    trace = open_trace(Path(args.trace))
    spec = load_model(args.model) if args.model else None
    from devices.achievable import at_bound, inputs

    raw = load_profile(args.device)
    sim = build(trace, spec, at_bound(raw, args.bound), cfg)
    fast = {"auto": "auto", "des": False, "fast": True}[args.engine]
    result = sim.run(fast=fast, timeline=bool(args.timeline))
    if args.records:
        result.write_records(args.records)
    if args.timeline:
        result.write_timeline(args.timeline)
    summary = result.summary()
    summary["config"]["differs_from_preset"] = _differences(cfg)
    summary["bound"] = args.bound
    summary["power_mode"] = raw.power_mode
    summary["device_inputs"] = inputs(raw, args.bound, sim.spec.dtype)
    if args.bound == "achievable":   # the datasheet ceiling beside the expected figure
        peak = build(trace, spec, at_bound(raw, "peak"), cfg).run(fast=fast).summary()
        summary["peak_bound"] = {k: peak[k] for k in PEAK_KEYS}
    summary["ideal_policy_bound"] = ideal_policy_bound(summary, trace, spec, at_bound(raw, args.bound), cfg, fast)
    if args.json:
        print_json(summary)
    else:
        _print_summary(summary, args)
    return 0


def ideal_policy_bound(summary: dict[str, Any], trace: Any, spec: Any, profile: Any, cfg: Any,
                       fast: Any) -> dict[str, Any]:
    """The same run with a perfect predictor and prefetch (sim.policies.presets.ideal_policy) on the same
    device numbers: `PEAK_KEYS` and `policies` (what was idealised; empty when the run already was)."""
    from sim.engine import build
    from sim.policies.presets import ideal_policy

    ideal_cfg = ideal_policy(cfg)
    if ideal_cfg is None:
        return {**{k: summary[k] for k in PEAK_KEYS}, "policies": {}}
    s = build(trace, spec, profile, ideal_cfg).run(fast=fast).summary()
    changed = {slot: c.to_dict() for slot, c in ideal_cfg.slots().items() if c != cfg.slots()[slot]}
    return {**{k: s[k] for k in PEAK_KEYS}, "policies": changed}


def _differences(cfg: Any) -> list[str]:
    """Every slot and parameter where the run's configuration differs from its preset."""
    from sim.config import differs_from_preset
    from sim.policies.presets import PRESETS, preset_config

    return differs_from_preset(cfg, preset_config(cfg.preset)) if cfg.preset in PRESETS else []


def _print_summary(s: dict[str, Any], args: argparse.Namespace) -> None:
    c = s["config"]
    mode = f" in power mode {s['power_mode']}" if s.get("power_mode") else ""
    changed = c.get("differs_from_preset")
    preset = f"{c['preset']} with {', '.join(changed)}" if changed else c["preset"]
    print(f"{c['model']} ({c['model_dtype']}) on {c['device']}{mode}, preset {preset}, "
          f"budget {format_bytes(c['dram_budget_bytes'])}, engine {s['engine']}, runtime {c['compute']['runtime']}, "
          f"{s.get('bound', 'achievable')} device numbers")
    print(UNITS_NOTE)
    print("policies: " + "; ".join(f"{slot}={p['name']}" + _params(p) for slot, p in c["policies"].items()))
    if c.get("cache_shares"):   # memory.cache_split other than equal (sim/policies/cache_shares.py)
        sh = c["cache_shares"]
        r = sh["rows_per_layer"]
        print(f"cache split: {sh['mode']}, {min(r)}..{max(r)} neurons per layer ({sh['reference_rows']} in all)")
    pk, ib = s.get("peak_bound"), s.get("ideal_policy_bound")
    beside = (lambda key, fmt: f"; peak-bound {fmt(pk[key])}") if pk else (lambda key, fmt: "")
    ideal = (lambda key, fmt: f"; ideal-policy bound {fmt(ib[key])}") if ib else (lambda key, fmt: "")
    rows = [
        ["ms per token", f"{s[MS_PER_TOKEN]:.3f}", f"p50 {s[LATENCY_P50_MS]:.3f}, p90 {s[LATENCY_P90_MS]:.3f}"
         + beside(MS_PER_TOKEN, lambda v: f"{v:.3f}") + ideal(MS_PER_TOKEN, lambda v: f"{v:.3f}")],
        ["tokens per s", f"{s[TOKENS_PER_S]:.2f}", f"batch {s['batch']}, {s['decode_tokens']} tokens"
         + beside(TOKENS_PER_S, lambda v: f"{v:.2f} (datasheet ceiling)")
         + ideal(TOKENS_PER_S, lambda v: f"{v:.2f}")],
        ["  I/O ms", f"{s[IO_MS_PER_TOKEN]:.3f}", "flash busy for the token (may overlap compute)"],
        ["  compute ms", f"{s[COMPUTE_MS_PER_TOKEN]:.3f}", "attention, predictor, FFN, lm_head"],
        ["  stall ms", f"{s[STALL_MS_PER_TOKEN]:.3f}", "waiting for flash"],
        ["  memory mgmt ms", f"{s[MEMORY_MGMT_MS_PER_TOKEN]:.3f}", "moving cache rows"],
        ["flash bytes/token", format_bytes(s[FLASH_BYTES_PER_TOKEN]), f"{s[FLASH_READS_PER_TOKEN]:.0f} reads"],
        ["flash throughput", format_rate(s[FLASH_THROUGHPUT_BYTES_PER_S]), "bytes / flash busy time"],
        ["DRAM peak", format_bytes(s[DRAM_PEAK_BYTES]), f"fixed {format_bytes(c['fixed_bytes'])}"],
        ["activation mass kept", f"{s[ACTIVATION_MASS_KEPT]:.4f}", f"recall {s[RECALL]:.4f}"],
    ]
    rows += energy_rows(s)
    if s["prefill"]:
        pf = s["prefill"]
        rows.append(["prefill ms", f"{pf['ms']:.3f}", f"{pf['tokens']} tokens, {format_bytes(pf['flash_bytes'])} read"])
    print_table(["metric", "value", "note"], rows, align="lrl")
    print(inputs_line(s.get("device_inputs", [])))
    if ib:
        print(ideal_line(ib))
    for n in s["notes"]:
        print(f"note: {n}")
    if s[JOULES_PER_TOKEN] is None:
        print(f"note: the device profile has no energy section: no energy per token ({c['device']})")


def energy_rows(s: dict[str, Any]) -> list[list[str]]:
    """Table rows of the energy per token and its components (none without energy numbers)."""
    if s.get(JOULES_PER_TOKEN) is None:
        return []
    mj, inp = s[ENERGY_MJ_PER_TOKEN], s["energy_inputs_per_token"]
    kinds = sorted(set(s["energy_source_kinds"].values()))
    rows = [["energy per token", f"{s[JOULES_PER_TOKEN] * 1e3:.3f} mJ",
             f"{s[JOULES_PER_TOKEN]:.4g} J; inputs: {', '.join(kinds)} (docs/energy.md)"]]
    notes = {"flash": f"storage active over {inp['flash_busy_s'] * 1e3:.3f} ms busy",
             "dram": f"{format_bytes(inp['dram_bytes'])} moved",
             "compute": f"{inp['flops'] / 1e9:.3f} GFLOP, {inp['compute_busy_s'] * 1e3:.3f} ms busy",
             "static": f"platform idle over {inp['token_s'] * 1e3:.3f} ms"}
    rows += [[f"  {k} mJ", f"{mj[k]:.3f}", notes[k]] for k in ("flash", "dram", "compute", "static")]
    return rows


def ideal_line(ib: dict[str, Any]) -> str:
    """What the ideal-policy bound idealised (docs/replay.md, "Expected figure and bounds")."""
    if not ib.get("policies"):
        return "policy idealisations: none (no predictor or prefetch to make perfect): ideal-policy bound = expected"
    what = "; ".join(f"{slot}={p['name']}" + _params(p) for slot, p in ib["policies"].items())
    return f"policy idealisations: expected uses the preset's realistic predictor/prefetch; ideal-policy bound: {what}"


def inputs_line(rows: list[dict[str, Any]]) -> str:
    """One line naming which device inputs are measured, published, datasheet figures or estimates."""
    from devices.achievable import inputs_by_kind

    cal = [r for r in rows if r["input"] == "calibration"]
    kinds = inputs_by_kind([r for r in rows if r["input"] != "calibration"])
    return ("device inputs: " + "; ".join(f"{k}: {', '.join(v)}" for k, v in kinds.items())
            + "".join(f"; {r['value']}" for r in cal))


def _params(p: dict[str, Any]) -> str:
    extra = {k: v for k, v in p.items() if k != "name"}
    return "(" + ", ".join(f"{k}={v}" for k, v in extra.items()) + ")" if extra else ""


def _list_params(args: argparse.Namespace) -> int:
    from sim.config import SECTIONS
    from sim.params import describe_params
    from sim.policies.presets import PRESETS, preset_config
    from sim.policies.registry import REGISTRIES

    chosen = preset_config(args.preset).to_dict() if args.preset else None
    doc: dict[str, Any] = {"slots": {}, "sections": {}, "presets": {}}
    for slot, reg in REGISTRIES.items():
        doc["slots"][slot] = {
            name: {"doc": (reg.get(name).__doc__ or "").strip().splitlines()[0],
                   "params": describe_params(reg.get(name).Params)}
            for name in reg.names()}
    for name, sec in SECTIONS.items():
        doc["sections"][name] = describe_params(sec)
    for name, spec in PRESETS.items():
        doc["presets"][name] = {"description": spec["description"], **preset_config(name).to_dict()}
    if args.json:
        print_json(doc if chosen is None else {**doc, "preset": chosen})
        return 0
    print("Slots (choose with --set SLOT=POLICY; parameters with --set POLICY.PARAM=VALUE or SLOT.PARAM=VALUE):")
    for slot, pols in doc["slots"].items():
        print(f"\n[{slot}]")
        for name, d in pols.items():
            mark = ""
            if chosen and chosen[slot]["name"] == name:
                mark = f"   <- {args.preset}"
            print(f"  {name}: {d['doc']}{mark}")
            for prm in d["params"]:
                val = chosen[slot].get(prm["name"], prm["default"]) if mark else prm["default"]
                print(f"      {name}.{prm['name']} = {val!r}  ({prm['type']}) {prm['help']}")
    print("\nSections (--set SECTION.PARAM=VALUE):")
    for name, prms in doc["sections"].items():
        for prm in prms:
            print(f"  {name}.{prm['name']} = {prm['default']!r}  ({prm['type']}) {prm['help']}")
    print("\nPresets (--preset NAME):")
    for name, d in doc["presets"].items():
        slots = ", ".join(f"{s}={d[s]['name']}" for s in REGISTRIES)
        print(f"  {name}: {d['description']}\n      {slots}")
    return 0
