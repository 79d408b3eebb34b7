"""Controllers: what to drop or restore at each decision point of an episode.

`base` holds the `AdaptState` a controller sees and the `Controller` protocol; every other module
here is one controller: `static_ratio` (static-ratio), `static_window` (static-window), `heuristic`
(heuristic, and heuristic-bytes: its per-byte rule), `learned` (DQN policy).
`make_controller` builds one by its CLI name; the learned controller is imported only when asked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from devices.errors import unknown_name

CONTROLLER_NAMES = ("static-ratio", "static-window", "heuristic", "heuristic-bytes", "learned")
DEFAULT_CONTROLLERS = ("static-ratio", "static-window", "heuristic", "heuristic-bytes", "learned")


def make_controller(name: str, *, spec: Any, kv_tokens_max: int, static_ratio: float = 0.25,
                    headroom: float | None = None, weights: str | Path | None = None) -> Any:
    """A fresh controller by CLI name (FlashsimError for an unknown name or bad parameters)."""
    if name == "static-ratio":
        from adapt.controllers.static_ratio import StaticRatio

        return StaticRatio(static_ratio)
    if name == "static-window":
        from adapt.controllers.static_window import StaticWindow

        return StaticWindow(spec, kv_tokens_max)
    if name in ("heuristic", "heuristic-bytes"):
        from adapt.controllers.heuristic import DEFAULT_HEADROOM, Heuristic

        return Heuristic("importance" if name == "heuristic" else "per-byte",
                         DEFAULT_HEADROOM if headroom is None else headroom)
    if name == "learned":
        from adapt.controllers.learned import LearnedController

        return LearnedController(weights=weights)
    raise unknown_name("controller", name, CONTROLLER_NAMES)


def learned_unavailable(weights: str | Path | None) -> str | None:
    """Why the learned controller cannot run here (None when it can): its module or weights missing."""
    try:
        from adapt.controllers import learned
    except ImportError as e:
        return f"the learned controller's module is not available ({e})"
    path = Path(weights) if weights is not None else learned.default_weights_path()
    if not path.is_file():
        return (f"no learned-controller weights at {path} (train with `flashsim adapt train`, "
                "or pass --weights FILE)")
    return None


__all__ = ["CONTROLLER_NAMES", "DEFAULT_CONTROLLERS", "learned_unavailable", "make_controller"]
