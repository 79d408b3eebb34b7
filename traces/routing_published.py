"""Published routing records flashsim knows how to fetch and import, each pinned to a commit and checksums.

`mixtral-8x7b-speculative-moe`: Mixtral-8x7B-Instruct-v0.1 (FP8 weights, served by a vLLM build with a
routing profiler) decoding 2 HumanEval and 2 GSM8K problems: 32 MoE layers, 8 experts, top-2, router
weights as the model applies them (softmax renormalised over the top 2), decode tokens only, 583 tokens
in all. Repository Mario928/speculative-moe, commit 216e26eb86ee09fa46bb0e8c000be7e9758e10b6 (the last
commit that holds these files as text; later commits moved them to Git LFS). The repository has no
license file, so flashsim does not ship the records: `scripts/fetch_routing_trace.py` downloads them
into the flashsim cache folder and imports them, and tests that need them skip when they are absent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from devices.errors import FlashsimError, unknown_name

PUBLISHED: dict[str, dict[str, Any]] = {
    "mixtral-8x7b-speculative-moe": {
        "model": "mixtral-8x7b",
        "n_layers": 32,
        "n_experts": 8,
        "phase": "decode",
        "repository": "https://github.com/Mario928/speculative-moe",
        "commit": "216e26eb86ee09fa46bb0e8c000be7e9758e10b6",
        "license": "none stated (no LICENSE file at this commit): not redistributed; fetched from the source",
        "collected_with": "Mixtral-8x7B-Instruct-v0.1-FP8 on vLLM with the repository's routing profiler "
                          "(profiling_moe_code/); decode tokens only",
        "files": {
            "routing_data_collected/humaneval_2_routing.jsonl":
                "761a87b678ffb713c40f0306d1bacc4346e70b78e5b767529495e8093d47609e",
            "routing_data_collected/gsm8k_2_routing.jsonl":
                "1bb2e9f769561165e952b1372cfaa61c678d93fb3edf298c0b34bfe9eee13e3a",
        },
    },
}


def published(name: str) -> dict[str, Any]:
    if name not in PUBLISHED:
        raise unknown_name("published routing trace", name, PUBLISHED)
    return PUBLISHED[name]


def raw_url(name: str, path: str) -> str:
    p = published(name)
    repo = p["repository"].removeprefix("https://github.com/")
    return f"https://raw.githubusercontent.com/{repo}/{p['commit']}/{path}"


def records_dir(name: str) -> Path:
    """Where the fetch script stores the raw records of `name` (the flashsim cache folder)."""
    from traces.capture.models import cache_dir

    return cache_dir() / "routing" / name


def trace_dir(name: str) -> Path:
    """Where the fetch script writes the imported routing trace of `name`."""
    return records_dir(name) / "trace"


def record_paths(name: str, folder: str | Path | None = None) -> list[Path]:
    """The raw record files of `name` in `folder` (default: records_dir), checked against the pinned
    SHA-256; FlashsimError names a missing or changed file and says how to fetch it."""
    import hashlib

    base = Path(folder) if folder is not None else records_dir(name)
    out = []
    for rel, digest in published(name)["files"].items():
        f = base / Path(rel).name
        if not f.is_file():
            raise FlashsimError(f"{f}: missing; run `python scripts/fetch_routing_trace.py {name}` to download it")
        if hashlib.sha256(f.read_bytes()).hexdigest() != digest:
            raise FlashsimError(f"{f}: SHA-256 differs from the pinned {digest[:12]}...; delete it and fetch again")
        out.append(f)
    return out


def import_published(name: str, out: str | Path, folder: str | Path | None = None, overwrite: bool = False) -> Path:
    """Import the checked raw records of `name` into a routing trace at `out`."""
    from traces.routing_import import import_routing_jsonl

    p = published(name)
    prov = {"name": name, "repository": p["repository"], "commit": p["commit"], "license": p["license"],
            "collected_with": p["collected_with"], "paths": list(p["files"])}
    return import_routing_jsonl(record_paths(name, folder), out, model=p["model"], n_layers=p["n_layers"],
                                n_experts=p["n_experts"], phase=p["phase"], provenance=prov, overwrite=overwrite)
