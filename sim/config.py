"""Run configuration: one policy per slot plus the workload, memory, flash and simulation sections.

`RunConfig` is frozen and validated on construction; unknown keys are errors that name the key.
It comes from a preset (`sim.policies.presets`), a mapping/YAML (`RunConfig.from_dict`,
`load_config`) and `--set key=value` overrides (`with_overrides`):

    --set prefetch=delta              put policy `delta` in slot `prefetch` (default parameters)
    --set window.k=3                  parameter `k` of the policy in use named `window`
    --set residency.k=3               ... the same, addressed by slot
    --set workload.batch=4            a section parameter (workload, memory, flash, sim, prune)
    --set prune.blocks=mha:3,ffn:5    drop blocks (sim/blocks.py syntax; checked against the model at build)
    --set seed=7                      shorthand for sim.seed

Slot switches are applied before parameters, so `--set residency=window --set window.k=2` works in
any order. Values are parsed to the parameter's type (sizes accept units: '4GiB').
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from devices.errors import FlashsimError, unknown_name
from devices.loading import read_mapping
from devices.runtime import DEFAULT_RUNTIME, list_runtimes
from devices.suggest import did_you_mean, hint
from sim.blocks import parse_block_items
from sim.components.memory import BudgetTimeline
from sim.params import build_params, check, param, params_to_dict
from sim.policies.registry import REGISTRIES, SLOTS, all_policies, find_slot


@dataclass(frozen=True)
class WorkloadParams:
    """What is generated: prompt, decode tokens, batch."""

    prompt_tokens: int | None = param(None, "prompt tokens per sequence (prefill, one batched step); "
                                            "default: each replayed prompt's own length")
    tokens: int | None = param(None, "decode steps to simulate (one token per sequence each); "
                                     "default: every generated token in the trace")
    batch: int = param(1, "sequences decoded together (each step computes the union of their active sets)")

    def __post_init__(self) -> None:
        check(self.batch >= 1, f"batch must be >= 1, got {self.batch}")
        check(self.tokens is None or self.tokens >= 1, f"tokens must be >= 1, got {self.tokens}")
        check(self.prompt_tokens is None or self.prompt_tokens >= 0,
              f"prompt_tokens must be >= 0, got {self.prompt_tokens}")


@dataclass(frozen=True)
class MemoryParams:
    """DRAM budget and what stays resident."""

    dram_budget_bytes: int | None = param(None, "DRAM for the model, caches and KV cache (default: the "
                                                "device's capacity minus its reserved memory)", unit="bytes")
    stream_non_ffn: bool = param(False, "also read attention weights, embeddings and lm_head from flash "
                                        "every step instead of keeping them resident")
    cache_split: Literal["equal", "by_bytes_needed", "greedy_marginal"] = param(
        "equal", "how the neuron cache's DRAM is split between layers (residencies with a per-layer cache: "
                 "window): equal; by_bytes_needed (in proportion to each layer's active neurons per step in the "
                 "trace); greedy_marginal (rows to the layer whose trace-measured hits gain most per row)")

    def __post_init__(self) -> None:
        check(self.dram_budget_bytes is None or self.dram_budget_bytes > 0,
              f"dram_budget_bytes must be > 0, got {self.dram_budget_bytes}")


@dataclass(frozen=True)
class FlashParams:
    """How the storage is driven."""

    in_flight: int | None = param(None, "reads kept in flight (default: the device's max_in_flight)")

    def __post_init__(self) -> None:
        check(self.in_flight is None or self.in_flight >= 1, f"in_flight must be >= 1, got {self.in_flight}")


@dataclass(frozen=True)
class ComputeParams:
    """The software that runs the model's layers."""

    framework: Literal["hf", "kernels"] = param(
        "hf", "hf: decoder layers run through Hugging Face transformers' modules (a Python loop makes "
              "LOOP_ATTENTION_OPS['hf'] torch calls per layer's attention); kernels: the kernels alone (a "
              "fused runtime, or shape mode's stand-in)")
    decoder: Literal["python", "native"] = param(
        "python", "python: a Python layer loop drives the kernels (the real backend, both modes: policy "
                  "bookkeeping, cache indexing and the FFN's small ops between kernels hold the interpreter "
                  "lock), so on a host whose reads share the CPU its interference constants follow its "
                  "seconds per torch call, phase by phase, between the profile's three probes (flash.*_probe_op_s; without "
                  "them the flash.framework_* constants in every phase) and it loses a prefetch's planning; "
                  "native: a compiled loop, which takes the kernel constants (flash.compute_lost_s_per_read ...)")
    runtime: str = param(DEFAULT_RUNTIME, "the inference runtime whose kernels the device runs (devices/runtimes/: "
                                          "kernels per layer and host dispatch per op, each with its source): "
                                          + ", ".join(list_runtimes()))

    def __post_init__(self) -> None:
        if self.runtime not in list_runtimes():
            raise unknown_name("runtime", self.runtime, list_runtimes())


@dataclass(frozen=True)
class SimParams:
    """Simulation options."""

    seed: int = param(0, "seed of every random stream (noisy predictors, orderings)")
    contention: bool = param(True, "on unified-memory devices, flash DMA slows memory-bound compute")
    rescale: bool = param(False, "replay a trace on a model of another shape (layers and neurons tiled)")

    def __post_init__(self) -> None:
        check(self.seed >= 0, f"seed must be >= 0, got {self.seed}")


@dataclass(frozen=True)
class PruneParams:
    """Transformer blocks removed from the model (RAP block pruning; see sim/blocks.py)."""

    blocks: str = param("", "dropped blocks, e.g. 'mha:3,ffn:5' (KIND:LAYER, KIND mha or ffn, layers from 0): "
                            "a dropped ffn reads, caches and computes nothing; a dropped mha keeps no attention "
                            "weights or KV cache and computes no attention")

    def __post_init__(self) -> None:
        # the syntax is checked here; the layer range when the model is known (sim.engine.build)
        try:
            parse_block_items(self.blocks, where="blocks")
        except FlashsimError as e:
            raise ValueError(str(e)) from None


SECTIONS: dict[str, type] = {"workload": WorkloadParams, "memory": MemoryParams, "flash": FlashParams,
                             "compute": ComputeParams, "sim": SimParams, "prune": PruneParams}


@dataclass(frozen=True)
class PolicyChoice:
    """A slot's policy name with its validated parameters."""

    slot: str
    name: str
    params: Any

    @classmethod
    def build(cls, slot: str, spec: str | Mapping[str, Any]) -> PolicyChoice:
        if isinstance(spec, str):
            name, params = spec, {}
        elif isinstance(spec, Mapping):
            if "name" not in spec:
                raise FlashsimError(f"{slot}: give the policy as a name or a mapping with 'name'")
            params = {k: v for k, v in spec.items() if k != "name"}
            name = str(spec["name"])
        else:
            raise FlashsimError(f"{slot}: expected a policy name or mapping, got {spec!r}")
        reg = REGISTRIES[slot]
        cls_ = reg.get(name)
        return cls(slot, name, build_params(cls_.Params, params, name))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **params_to_dict(self.params)}

    def instantiate(self) -> Any:
        return REGISTRIES[self.slot].get(self.name)(self.params)


def _default_choice(slot: str) -> PolicyChoice:
    defaults = {"residency": "naive", "predictor": "none", "layout": "bundling", "prefetch": "none",
                "precision": "native"}
    return PolicyChoice.build(slot, defaults[slot])


@dataclass(frozen=True)
class RunConfig:
    """Everything one run needs besides the trace, model and device."""

    preset: str = "custom"
    residency: PolicyChoice = field(default_factory=lambda: _default_choice("residency"))
    predictor: PolicyChoice = field(default_factory=lambda: _default_choice("predictor"))
    layout: PolicyChoice = field(default_factory=lambda: _default_choice("layout"))
    prefetch: PolicyChoice = field(default_factory=lambda: _default_choice("prefetch"))
    precision: PolicyChoice = field(default_factory=lambda: _default_choice("precision"))
    workload: WorkloadParams = field(default_factory=WorkloadParams)
    memory: MemoryParams = field(default_factory=MemoryParams)
    flash: FlashParams = field(default_factory=FlashParams)
    compute: ComputeParams = field(default_factory=ComputeParams)
    sim: SimParams = field(default_factory=SimParams)
    prune: PruneParams = field(default_factory=PruneParams)
    budget_timeline: BudgetTimeline | None = None

    def slots(self) -> dict[str, PolicyChoice]:
        return {s: getattr(self, s) for s in SLOTS}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"preset": self.preset}
        out.update({s: c.to_dict() for s, c in self.slots().items()})
        out.update({name: params_to_dict(getattr(self, name)) for name in SECTIONS})
        out["budget_timeline"] = self.budget_timeline.to_list() if self.budget_timeline else None
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "config") -> RunConfig:
        """Strict: unknown top-level keys, slots, sections or parameters raise FlashsimError."""
        allowed = {"preset", *SLOTS, *SECTIONS, "budget_timeline"}
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise FlashsimError(f"{where}: unknown key {unknown[0]!r}; {hint(unknown[0], sorted(allowed), 'valid keys')}")
        kwargs: dict[str, Any] = {"preset": str(data.get("preset", "custom"))}
        for s in SLOTS:
            if s in data:
                kwargs[s] = PolicyChoice.build(s, data[s])
        for name, sec in SECTIONS.items():
            if name in data:
                if not isinstance(data[name], Mapping):
                    raise FlashsimError(f"{where}: {name} must be a mapping")
                kwargs[name] = build_params(sec, data[name], name)
        tl = data.get("budget_timeline")
        if tl is not None:
            try:
                kwargs["budget_timeline"] = BudgetTimeline(tuple(float(p[0]) for p in tl),
                                                           tuple(int(p[1]) for p in tl))
            except (TypeError, ValueError, IndexError) as e:
                raise FlashsimError(f"{where}: budget_timeline: {e}") from None
        return cls(**kwargs)

    def with_overrides(self, settings: Iterable[str]) -> RunConfig:
        """Apply `key=value` strings (see the module docstring). A slot switched to another policy
        is built once, with its defaults plus every parameter set for it in the same call; a slot
        "switched" to the policy it already holds keeps that policy's parameters."""
        parsed = []
        for item in settings:
            key, sep, value = item.partition("=")
            key, value = key.strip(), value.strip()
            if not sep or not key:
                raise FlashsimError(f"--set {item!r}: expected key=value, e.g. window.k=3")
            if key == "seed":
                key = "sim.seed"
            parsed.append((item, key, value))
        switched = {key: value for _item, key, value in parsed if key in SLOTS}
        names = {s: switched.get(s, getattr(self, s).name) for s in SLOTS}
        slot_params: dict[str, dict[str, Any]] = {s: {} for s in SLOTS}
        section_params: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
        for item, key, value in parsed:
            if key in SLOTS:
                continue
            head, dot, name = key.partition(".")
            if not dot:
                suggestion = did_you_mean(key, [*SLOTS, "seed"])
                raise FlashsimError(f"--set {item!r}: unknown setting {key!r}; "
                                    f"{suggestion + ' ' if suggestion else ''}use a slot "
                                    f"({', '.join(SLOTS)}) to choose a policy, or SLOT.PARAM / "
                                    f"SECTION.PARAM ({', '.join(SECTIONS)}) for a parameter")
            if head in SECTIONS:
                section_params[head][name] = value
            else:
                slot_params[self._slot_of(item, head, names)][name] = value
        kwargs: dict[str, Any] = {}
        for s in SLOTS:
            if s in switched or slot_params[s]:
                current = getattr(self, s)
                keep = s not in switched or switched[s] == current.name
                base = params_to_dict(current.params) if keep else {}
                kwargs[s] = PolicyChoice.build(s, {"name": names[s], **base, **slot_params[s]})
        for sec, values in section_params.items():
            if values:
                kwargs[sec] = build_params(SECTIONS[sec], {**params_to_dict(getattr(self, sec)), **values}, sec)
        return replace(self, **kwargs) if kwargs else self

    @staticmethod
    def _slot_of(item: str, head: str, names: dict[str, str]) -> str:
        if head in SLOTS:
            return head
        for slot, name in names.items():
            if name == head:
                return slot
        owner = find_slot(head)
        if owner is not None:
            raise FlashsimError(f"--set {item!r}: policy {head!r} is not in use (slot {owner} holds "
                                f"{names[owner]!r}); add --set {owner}={head} first")
        suggestion = did_you_mean(head, [*SLOTS, *names.values(), *SECTIONS, *(n for _, n in all_policies())])
        raise FlashsimError(f"--set {item!r}: {head!r} is not a slot ({', '.join(SLOTS)}), a policy in use "
                            f"({', '.join(sorted(names.values()))}) or a section ({', '.join(SECTIONS)})"
                            + (f"; {suggestion}" if suggestion else ""))


def apply_partial(base: RunConfig, data: Mapping[str, Any], where: str = "config") -> RunConfig:
    """`base` with only what `data` names changed: a slot given with the policy `base` already has
    keeps that policy's other parameters (a slot given with another policy starts from its defaults),
    a section keeps the parameters `data` does not name; unnamed slots and sections stay as they are."""
    merged = base.to_dict()
    for key, value in data.items():
        same_policy = key in SLOTS and isinstance(value, Mapping) and value.get("name") in (None, merged[key]["name"])
        if same_policy or (key in SECTIONS and isinstance(value, Mapping)):
            merged[key] = {**merged[key], **value}
        elif key != "preset":
            merged[key] = value
    merged["preset"] = base.preset
    return RunConfig.from_dict(merged, where=where)


def differs_from_preset(cfg: RunConfig, preset: RunConfig) -> list[str]:
    """Every slot (`prefetch=none`) and parameter (`window.k=5`, `memory.dram_budget_bytes=...`)
    where `cfg` differs from its preset's configuration, in slot then section order."""
    a, b = cfg.to_dict(), preset.to_dict()
    out = []
    for s in SLOTS:
        if a[s]["name"] != b[s]["name"]:
            out.append(f"{s}={a[s]['name']}")       # another policy (with its parameters as given)
        else:
            out += [f"{a[s]['name']}.{k}={v}" for k, v in a[s].items() if k != "name" and b[s].get(k) != v]
    for sec in SECTIONS:
        out += [f"{sec}.{k}={v}" for k, v in a[sec].items() if b[sec].get(k) != v]
    if a.get("budget_timeline") != b.get("budget_timeline"):
        out.append("budget_timeline")
    return out


def load_config(path: str | Path) -> RunConfig:
    """A RunConfig from a YAML or JSON file (strict)."""
    path = Path(path)
    return RunConfig.from_dict(read_mapping(path), where=str(path))
