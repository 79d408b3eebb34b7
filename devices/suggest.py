"""`did you mean` for an unknown name: the close matches of a name among the valid ones.

One rule for every name a user types (model, device, preset, policy slot, parameter, profile key,
trace folder): a name that differs from a valid one only in case is that name; otherwise the valid
names it starts, then those most similar to it (difflib's ratio, compared in lower case, at least
`cutoff`), best first.
The helpers return text for an error message and raise nothing, so any layer can use them.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

CUTOFF = 0.6   # difflib's similarity ratio: 'windw' vs 'window' is 0.91, 'cache' vs 'window' 0.18
MIN_PREFIX = 3  # a shorter start ('l', 'sm') is too common to mean one name


def close_matches(name: str, valid: Iterable[str], n: int = 3, cutoff: float = CUTOFF) -> list[str]:
    """The valid names closest to `name`, best first: a case-insensitive equal name alone, else up to
    `n` names whose lower-case similarity to `name` is at least `cutoff`."""
    valid = sorted(set(valid))
    folded = name.casefold()
    same = [v for v in valid if v.casefold() == folded]
    if same:
        return same
    by_folded: dict[str, list[str]] = {}
    for v in valid:
        by_folded.setdefault(v.casefold(), []).append(v)
    # a name that starts a valid one is a shortening of it ('eager' for 'eager-pytorch')
    prefixed = [f for f in by_folded if len(folded) >= MIN_PREFIX and f.startswith(folded)]
    close = difflib.get_close_matches(folded, list(by_folded), n=n, cutoff=cutoff)
    ordered = list(dict.fromkeys([*prefixed, *close]))
    return [v for f in ordered for v in by_folded[f]][:n]


def did_you_mean(name: str, valid: Iterable[str], n: int = 3, cutoff: float = CUTOFF) -> str:
    """The text "did you mean 'x'?" (or "'x' or 'y'") for the close matches of `name`; "" when none is close."""
    close = close_matches(name, valid, n=n, cutoff=cutoff)
    if not close:
        return ""
    return "did you mean " + " or ".join(repr(c) for c in close) + "?"


def hint(name: str, valid: Iterable[str], label: str = "valid") -> str:
    """The tail of an unknown-name message: the suggestion (if any) then every valid name in the
    order given, e.g. "did you mean 'window'? valid: dense, hybrid, window"."""
    valid = list(dict.fromkeys(valid))
    listing = f"{label}: " + (", ".join(valid) if valid else "(none)")
    suggestion = did_you_mean(name, valid)
    return f"{suggestion} {listing}" if suggestion else listing


PATH_SUFFIXES = (".json", ".yaml", ".yml", ".gguf", ".safetensors", ".npz")


def looks_like_path(text: str) -> bool:
    """True when `text` was meant as a file or folder (a separator, or a file suffix), so a missing one
    is a missing path; otherwise it is a name (a dot in 'llama-3.2-3B' is part of the name)."""
    return "/" in text or "\\" in text or text.casefold().endswith(PATH_SUFFIXES)


def sibling_hint(path: str, siblings: Iterable[str]) -> str:
    """For a missing path: "did you mean 'DIR/x'?" for the close matches of its last part among the
    names beside it (`siblings`), with a prefix match first (smollm2-135m -> smollm2-135m-builtin)."""
    parent, sep, last = path.rstrip("/").rpartition("/")
    siblings = sorted(set(siblings))
    prefixed = [s for s in siblings if s.casefold().startswith(last.casefold()) and last]
    close = prefixed[:3] or close_matches(last, siblings)
    if not close:
        return ""
    return "did you mean " + " or ".join(repr(f"{parent}{sep}{c}") for c in close) + "?"
