"""Drive the system's headless Chromium (Debian's `chromium` package) over the DevTools protocol on a
pipe (`--remote-debugging-pipe`: the browser reads commands on fd 3 and writes replies on fd 4, each
message JSON ended by a NUL byte). Standard library only; no browser download, no network port.

    with Chromium() as page:
        page.open(path)                       # waits for the load event
        page.eval("document.title")           # Runtime.evaluate, by value
        page.screenshot(png_path)
        page.errors                           # console errors, uncaught exceptions, failed loads
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--remote-debugging-pipe", "--window-size=1280,2000")


def find_chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


class Chromium:
    """One headless browser with one page; `errors` collects what the page's console would show red."""

    def __init__(self, exe: str | None = None, timeout_s: float = 60.0):
        self.exe = exe or find_chromium()
        if self.exe is None:
            raise FileNotFoundError("no chromium on PATH (Debian: apt-get install -y chromium)")
        self.timeout_s = timeout_s
        self.errors: list[str] = []
        self.events: list[dict[str, Any]] = []
        self._id = 0
        self._buf = b""

    def __enter__(self) -> Chromium:
        self._profile = tempfile.TemporaryDirectory(prefix="flashsim-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def fds() -> None:
            """The protocol's fixed descriptors in the child, inheritable (every other descriptor Python
            opened is close-on-exec). Through high numbers first: a pipe end may itself be 3 or 4."""
            os.dup2(to_child_r, 200)
            os.dup2(from_child_w, 201)
            for src, dst in ((200, 3), (201, 4)):
                os.dup2(src, dst)
                os.set_inheritable(dst, True)
                os.close(src)

        self.proc = subprocess.Popen([self.exe, *FLAGS, f"--user-data-dir={self._profile.name}", "about:blank"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     preexec_fn=fds, close_fds=False)
        os.close(to_child_r)
        os.close(from_child_w)
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable", session=True)
        return self

    def __exit__(self, *exc: Any) -> None:
        with contextlib.suppress(OSError, TimeoutError, RuntimeError):   # a browser that already went away
            self.send("Browser.close")
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_child, self._from_child):
            os.close(fd)
        self._profile.cleanup()

    # ---- the protocol ------------------------------------------------------------------------------
    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_child], [], [], left)[0]:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self._from_child, 1 << 20)
            if not chunk:
                raise ConnectionError("chromium closed its DevTools pipe")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def _note(self, msg: dict[str, Any]) -> None:
        self.events.append(msg)
        method, p = msg.get("method"), msg.get("params", {})
        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            self.errors.append("console: " + " ".join(str(a.get("value", a.get("description", ""))) for a in p["args"]))
        elif method == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            self.errors.append("exception: " + str(d.get("exception", {}).get("description", d.get("text"))))
        elif method == "Log.entryAdded" and p["entry"].get("level") == "error":
            self.errors.append(f"log ({p['entry'].get('source')}): {p['entry'].get('text')}")

    def send(self, method: str, params: dict[str, Any] | None = None, *, session: bool = False) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self.session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._note(reply)

    def wait_event(self, method: str) -> dict[str, Any]:
        for msg in self.events:
            if msg.get("method") == method:
                self.events.remove(msg)
                return msg
        deadline = time.monotonic() + self.timeout_s
        while True:
            msg = self._read_message(deadline)
            self._note(msg)
            if msg.get("method") == method:
                self.events.remove(msg)
                return msg

    # ---- the page ----------------------------------------------------------------------------------
    def open(self, path: Path) -> None:
        self.events.clear()
        self.send("Page.navigate", {"url": Path(path).resolve().as_uri()}, session=True)
        self.wait_event("Page.loadEventFired")

    def eval(self, expression: str) -> Any:
        r = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True},
                      session=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression[:60]}...: {r['exceptionDetails'].get('exception', r['exceptionDetails'])}")
        return r["result"].get("value")

    def screenshot(self, out: Path, full_page: bool = False) -> Path:
        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": full_page}
        data = self.send("Page.captureScreenshot", params, session=True)["data"]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(base64.b64decode(data))
        return out
