"""Download published routing records pinned in traces/routing_published.py and import them.

    python scripts/fetch_routing_trace.py [NAME] [--out DIR]

NAME defaults to mixtral-8x7b-speculative-moe (the only one pinned so far). Each file is fetched from
raw.githubusercontent.com at the pinned commit, checked against its pinned SHA-256, and stored under the
flashsim cache folder ($FLASHSIM_CACHE, else $XDG_CACHE_HOME/flashsim, else ~/.cache/flashsim) in
routing/NAME/; the routing trace is written to routing/NAME/trace (or --out). Files already present with
the right checksum are not fetched again. The records are not redistributed with flashsim: their
repository states no license.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devices.errors import FlashsimError  # noqa: E402
from traces.routing_published import (  # noqa: E402
    PUBLISHED,
    import_published,
    published,
    raw_url,
    records_dir,
    trace_dir,
)


def fetch(name: str) -> Path:
    folder = records_dir(name)
    folder.mkdir(parents=True, exist_ok=True)
    for rel, digest in published(name)["files"].items():
        dest = folder / Path(rel).name
        if dest.is_file() and hashlib.sha256(dest.read_bytes()).hexdigest() == digest:
            print(f"have {dest}")
            continue
        url = raw_url(name, rel)
        print(f"fetching {url}")
        with urllib.request.urlopen(url, timeout=60) as r:      # noqa: S310 (a pinned https URL)
            data = r.read()
        got = hashlib.sha256(data).hexdigest()
        if got != digest:
            raise FlashsimError(f"{url}: SHA-256 {got[:12]}... differs from the pinned {digest[:12]}...; not stored")
        tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, dest)
    return folder


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", nargs="?", default="mixtral-8x7b-speculative-moe", choices=sorted(PUBLISHED))
    ap.add_argument("--out", help="routing trace directory (default: NAME/trace in the cache folder)")
    args = ap.parse_args(argv)
    try:
        fetch(args.name)
        out = import_published(args.name, args.out or trace_dir(args.name), overwrite=True)
    except FlashsimError as e:
        print(f"fetch_routing_trace: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}; see it with `flashsim trace stats {out}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
