"""`flashsim devices` and `flashsim models`: list and show device profiles and model specs."""

from __future__ import annotations

import argparse

from devices import list_models, list_profiles, load_model, load_profile
from devices.moe_spec import MOE_DTYPE_BITS, is_moe_model
from devices.schema import DeviceProfile
from devices.units import format_bytes, format_rate
from flashsim.output import print_json, print_table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("devices", help="list device profiles, or show one")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_devices_list)
    dsub = p.add_subparsers(dest="devices_cmd", metavar="show")
    s = dsub.add_parser("show", help="show one device profile in full")
    s.add_argument("name", help="profile name or path to a profile YAML")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=_devices_show)

    p = sub.add_parser("models", help="list bundled model specs, or show one")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--dtype", choices=list(MOE_DTYPE_BITS), default=None,
                   help="weight dtype (default fp16; an MoE spec's own, e.g. mxfp4 for gpt-oss)")
    p.set_defaults(func=_models_list)
    msub = p.add_subparsers(dest="models_cmd", metavar="show")
    s = msub.add_parser("show", help="show one model's derived sizes and FLOPs")
    s.add_argument("name", help="bundled name (dense or MoE), a Hugging Face model folder, or a config.json")
    s.add_argument("--dtype", choices=list(MOE_DTYPE_BITS), default=None,
                   help="weight dtype (default fp16; an MoE spec's own, e.g. mxfp4 for gpt-oss)")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=_models_show)


def _devices_list(args: argparse.Namespace) -> int:
    profiles = [load_profile(n) for n in list_profiles()]
    if args.json:
        print_json([p.summary() for p in profiles])
        return 0
    rows = [
        [p.name, format_bytes(p.memory.capacity_bytes), format_bytes(p.available_bytes),
         format_rate(p.memory.bandwidth_bytes_per_s), "yes" if p.memory.unified else "no",
         format_rate(p.flash.sequential_read_bytes_per_s), format_rate(p.flash.bytes_per_s(4096)),
         p.source.kind]
        for p in profiles
    ]
    print_table(["device", "DRAM", "available", "DRAM bw", "unified", "flash seq", "flash 4K rand", "source"],
                rows, align="lrrrlrrl")
    return 0


def _devices_show(args: argparse.Namespace) -> int:
    from devices.achievable import at_bound, inputs

    p = load_profile(args.name)
    ach, peak = at_bound(p, "achievable"), at_bound(p, "peak")
    if args.json:
        print_json({**p.summary(), "power_mode": p.power_mode,
                    "power_modes": sorted(p.power_modes.modes) if p.power_modes else [],
                    "achievable": {"inputs": inputs(p, "achievable"), **_speeds(ach)},
                    "peak": {"inputs": inputs(p, "peak"), **_speeds(peak)},
                    "profile": p.model_dump(mode="json")})
        return 0
    print(f"{p.name}: {p.description}")
    print(f"  source: {p.source.kind}; " + "; ".join(p.source.references))
    m, c, f = p.memory, p.compute, p.flash
    print(f"  memory: {format_bytes(m.capacity_bytes)} ({format_bytes(p.available_bytes)} available), "
          f"{format_rate(m.bandwidth_bytes_per_s)}, unified={m.unified}  [{m.source}]")
    rates = ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in c.gemv_flops_per_s.items())
    print(f"  compute: {rates}; gather {format_rate(c.gather_bytes_per_s)}; "
          f"overhead {c.op_overhead_s * 1e6:.1f} us/op  [{c.source}]")
    print(f"  flash: sequential {format_rate(f.sequential_read_bytes_per_s)}, 4 KiB latency "
          f"{f.read_latency_s * 1e6:.0f} us, up to {f.max_in_flight} reads in flight  [{f.source}]")
    chunks = [4096, 16384, 65536, 262144, 1048576]
    depths = sorted({1, 4, 16, f.max_in_flight})
    rows = [[format_bytes(ch)] + [format_rate(f.bytes_per_s(ch, q)) for q in depths] for ch in chunks]
    print("  read throughput (" + ("measured table" if f.read_table else "closed-form model") + "):")
    print_table(["chunk"] + [f"q={q}" for q in depths], rows, align="r" * (len(depths) + 1))
    if p.power_modes is not None:
        print(f"  power mode: {p.power_mode} (modes: {', '.join(p.power_modes.modes)}; default "
              f"{p.power_modes.default}; pick one with NAME@MODE)")
    print("  achievable (the simulator's default) vs peak (--bound peak), with each input's source kind:")
    kinds = {r["input"]: r for r in inputs(p, "achievable")}
    pkinds = {r["input"]: r for r in inputs(p, "peak")}
    for name in dict.fromkeys([*kinds, *pkinds]):
        print(f"    {name}: achievable {_cell(kinds.get(name))}; peak {_cell(pkinds.get(name))}")
    ra, rp = ach.flash, peak.flash
    rows = [[format_bytes(ch)] + [f"{format_rate(ra.bytes_per_s(ch, q))} / {format_rate(rp.bytes_per_s(ch, q))}"
                                  for q in depths] for ch in chunks]
    print("  read throughput, achievable / peak:")
    print_table(["chunk"] + [f"q={q}" for q in depths], rows, align="r" * (len(depths) + 1))
    for r in inputs(p, "achievable"):
        print(f"    source of {r['input']} ({r['kind']}): {r['source']}")
    return 0


def _cell(r: dict | None) -> str:
    return "-" if r is None else f"{_fmt(r['value'])} [{r['kind']}]"


def _fmt(v: object) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k} {_fmt(x)}" for k, x in v.items())
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def _speeds(p: DeviceProfile) -> dict:
    f = p.flash
    return {"dram_bandwidth_bytes_per_s": p.memory.bandwidth_bytes_per_s,
            "flash_4k_q32_bytes_per_s": f.bytes_per_s(4096, min(32, f.max_in_flight)),
            "flash_16k_q32_bytes_per_s": f.bytes_per_s(16384, min(32, f.max_in_flight))}


def _models_list(args: argparse.Namespace) -> int:
    from flashsim.commands.moe_models import moe_table

    specs = [load_model(n, dtype=args.dtype or "fp16") for n in list_models()]
    if args.json:
        print_json([s.summary() for s in specs])
        return 0
    rows = [[s.name, s.family, f"{s.total_params / 1e9:.2f}B", s.n_layers, s.d_model, s.d_ff, s.ffn_kind,
             format_bytes(s.ffn_neuron_bytes), format_bytes(s.total_weight_bytes),
             format_bytes(s.kv_bytes_per_token)] for s in specs]
    print_table(["model", "family", "params", "layers", "d_model", "d_ff", "ffn", "neuron",
                 f"weights ({args.dtype or 'fp16'})", "KV/token"], rows, align="llrrrrlrrr")
    moe_table(args.dtype)
    return 0


def _models_show(args: argparse.Namespace) -> int:
    if is_moe_model(args.name):
        from flashsim.commands.moe_models import show_moe

        return show_moe(args)
    s = load_model(args.name, dtype=args.dtype or "fp16")
    d = s.summary()
    if args.json:
        print_json(d)
        return 0
    print(f"{s.name} ({s.family}, {s.total_params / 1e9:.3f}B parameters, {s.dtype})")
    print(f"  source: {s.source}")
    for k in ("n_layers", "d_model", "d_ff", "n_heads", "n_kv_heads", "head_dim", "vocab_size", "ffn_kind",
              "tied_embeddings"):
        print(f"  {k:22s} {d[k]}")
    for k in ("ffn_row_bytes", "ffn_neuron_bytes", "ffn_bytes_per_layer", "ffn_bytes_total",
              "attn_bytes_per_layer", "embedding_bytes", "lm_head_bytes", "non_ffn_bytes",
              "total_weight_bytes", "kv_bytes_per_token"):
        print(f"  {k:22s} {d[k]:>16,d}  ({format_bytes(d[k])})")
    for k, v in d["flops_per_token"].items():
        print(f"  flops/token {k:16s} {v:>16,.0f}")
    return 0
