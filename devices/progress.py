"""Progress of long work on stderr: a live bar on a terminal, one plain line per stage in a log.

Every long command reports through `Stage` (a counted stage of work: captured tokens, sweep points,
synthesised or converted layers, training steps), `phase` (an uncounted one: a load, a fit, one
measurement) and `note` (one line the user should see). On a
terminal a stage is a tqdm bar redrawn in place and removed when it ends. When stderr is not a
terminal (a log file, a pipe, CI) nothing is redrawn and no carriage return is written: a stage prints
one line when it ends (its count and seconds) and, only while it runs longer than `HEARTBEAT_S`, one
line per `HEARTBEAT_S` in between, so a log shows that the work is alive without a line per item.
Progress never goes to stdout, which holds the command's result (`--json` stays one JSON value).

`quiet_third_party()` turns off the progress bars of the libraries that load models (huggingface_hub
downloads, transformers' per-tensor weight loading), which would write tens of carriage-return
redraws into a log; the commands say in their own lines what they load and how long it took.

Like `suggest.py`, this module knows nothing of devices: it sits in the bottom package so that every
layer (trace capture and synthesis, the real backend's store writer, sweeps) reports the same way.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, TextIO, TypeVar

HEARTBEAT_S = 60.0   # in a log, at most one line per minute while a stage runs
PREFIX = "flashsim: "

T = TypeVar("T")


def is_terminal(stream: Any) -> bool:
    """Whether `stream` is an interactive terminal (a closed or fake stream is not)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def note(message: str, stream: TextIO | None = None) -> None:
    """One line on stderr: what the command starts now, or a fact the user should see beside its output."""
    print(PREFIX + message, file=stream if stream is not None else sys.stderr, flush=True)


class Stage:
    """A counted stage of work (`total` items of `unit`, or an open count when `total` is None).

    `update(n)` counts finished items; `close()` (or leaving the `with` block) ends the stage. On a
    terminal: a tqdm bar. Otherwise: the line `flashsim: DESC: N/TOTAL UNIT in S s` at the end (an
    open count that counted nothing: `DESC: done in S s`), and a
    `... so far` line at most every `heartbeat_s` while it runs. A stage left by an exception prints no
    end line (the error says what happened). `enabled=False` prints nothing at all.
    """

    def __init__(self, desc: str, total: int | None = None, unit: str = "items", *, enabled: bool = True,
                 initial: int = 0, stream: TextIO | None = None, heartbeat_s: float = HEARTBEAT_S):
        self.desc, self.total, self.unit, self.n = desc, total, unit, initial
        self._stream = stream if stream is not None else sys.stderr
        self._heartbeat_s = heartbeat_s
        self._t0 = self._last_line = time.monotonic()
        self._closed = not enabled
        self._bar: Any = None
        if enabled and is_terminal(self._stream):
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=desc, unit=f" {unit}", file=self._stream,
                             leave=False, dynamic_ncols=True)

    def __enter__(self) -> Stage:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close(finished=exc_type is None)

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self._t0

    def update(self, n: int = 1) -> None:
        if self._closed:
            return
        self.n += n
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        if now - self._last_line >= self._heartbeat_s:
            self._last_line = now
            self._line(f"{self._count()} so far, {now - self._t0:.0f} s")

    def set_postfix(self, text: str) -> None:
        """What the stage works on now (a prompt id, a read size); shown on the bar only."""
        if self._bar is not None and not self._closed:
            self._bar.set_postfix_str(text, refresh=False)

    def set_description(self, desc: str) -> None:
        """Rename the stage (a stage with sub-steps); in a log the end line carries the last name."""
        self.desc = desc
        if self._bar is not None and not self._closed:
            self._bar.set_description(desc, refresh=False)

    def close(self, finished: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        elif finished:
            self._line(f"{self._count()} in {self.elapsed_s:.1f} s")

    def _count(self) -> str:
        if self.total is None:
            return f"{self.n} {self.unit}" if self.n else "done"
        return f"{self.n}/{self.total} {self.unit}"

    def _line(self, text: str) -> None:
        print(f"{PREFIX}{self.desc}: {text}", file=self._stream, flush=True)


@contextlib.contextmanager
def phase(desc: str, *, enabled: bool = True, stream: TextIO | None = None) -> Iterator[None]:
    """An uncounted stage (loading, fitting, one long measurement). On a terminal: one line as it
    starts (`flashsim: DESC ...`); in a log: one line as it ends (`flashsim: DESC: done in S s`)."""
    out = stream if stream is not None else sys.stderr
    if not enabled:
        yield
        return
    if is_terminal(out):
        note(f"{desc} ...", out)
        yield
        return
    t0 = time.monotonic()
    yield   # an exception propagates from here and skips the end line
    note(f"{desc}: done in {time.monotonic() - t0:.1f} s", out)


class Stages:
    """Named stages reported through one callback, as the planner reports them: `stages(name)` ends
    the current stage and starts `name`; `stages(None)` counts one `unit` of the current stage. Each
    stage is a `Stage` of open count, prefixed `prefix: ` (a log gets one line per stage)."""

    def __init__(self, prefix: str, unit: str = "items", *, enabled: bool = True):
        self.prefix, self.unit, self.enabled = prefix, unit, enabled
        self.current: Stage | None = None

    def __call__(self, name: str | None) -> None:
        if name is None:
            if self.current is None:
                self.current = Stage(self.prefix, None, self.unit, enabled=self.enabled)
            self.current.update()
            return
        if self.current is not None:
            self.current.close()
        self.current = Stage(f"{self.prefix}: {name}", None, self.unit, enabled=self.enabled)

    def close(self, finished: bool = True) -> None:
        if self.current is not None:
            self.current.close(finished)
            self.current = None

    def __enter__(self) -> Stages:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close(finished=exc_type is None)


def track(items: Iterable[T], desc: str, unit: str = "items", *, total: int | None = None,
          enabled: bool = True) -> Iterator[T]:
    """Iterate `items` as one `Stage` (total: `len(items)` when it has one)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with Stage(desc, total, unit, enabled=enabled) as stage:
        for item in items:
            yield item
            stage.update()


def quiet_third_party(stream: Any = None) -> None:
    """Turn off the progress bars of huggingface_hub and transformers.

    Transformers' per-tensor "Loading weights" bar is turned off everywhere (a cached load takes well
    under a second; the commands time their loads themselves). Hub download bars stay on a terminal
    and are turned off when stderr is not one. The environment variable covers libraries imported
    later (and subprocesses); the calls cover those already imported. A user's own
    HF_HUB_DISABLE_PROGRESS_BARS wins over the default."""
    if not is_terminal(stream if stream is not None else sys.stderr):
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        if "huggingface_hub" in sys.modules and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1":
            from huggingface_hub.utils import disable_progress_bars

            disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
