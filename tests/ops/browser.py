"""A real headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``:
JSON messages separated by NUL bytes on fds 3 and 4) — no driver download, no websocket library."""

from __future__ import annotations

import base64
import json
import os
import queue
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["chromium_binary", "Browser"]


def chromium_binary() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class Browser:
    """One headless browser process and one page (a flattened DevTools session)."""

    def __init__(self, binary: str, profile_dir: Path, *, timeout_s: float = 60.0) -> None:
        self.timeout_s = timeout_s
        import fcntl

        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        # The child's ends above fd 10, so the shell's "3<&N 4>&M" never overwrites one with the other.
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_child_r, from_child_w)]
        os.close(to_child_r)
        os.close(from_child_w)
        to_child_r, from_child_w = high
        args = [binary, "--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
                "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
                "--disable-extensions", "--window-size=1200,900", f"--user-data-dir={profile_dir}", "about:blank"]
        # The protocol wants fds 3 (commands in) and 4 (answers out): let bash (fds above 9) put them there.
        script = f'exec "$@" 3<&{to_child_r} 4>&{from_child_w} {to_child_r}<&- {from_child_w}>&-'
        self.log = open(profile_dir.parent / "chromium.log", "wb")
        self.proc = subprocess.Popen(["bash", "-c", script, "bash", *args], pass_fds=(to_child_r, from_child_w),
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
                                     start_new_session=True)
        os.close(to_child_r)
        os.close(from_child_w)
        self._next = 0
        self._answers: dict[int, queue.Queue[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.call("Page.enable", session=True)

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                data = os.read(self._from_child, 1 << 16)
            except OSError:
                return
            if not data:
                return
            buf += data
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "id" in msg:
                    with self._lock:
                        box = self._answers.get(msg["id"])
                    if box is not None:
                        box.put(msg)

    def call(self, method: str, params: dict[str, Any] | None = None, *, session: bool = False) -> dict[str, Any]:
        with self._lock:
            self._next += 1
            ident = self._next
            box: queue.Queue[dict[str, Any]] = queue.Queue()
            self._answers[ident] = box
        msg: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self.session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        try:
            answer = box.get(timeout=self.timeout_s)
        except queue.Empty:
            raise AssertionError(f"chromium did not answer {method} within {self.timeout_s:g}s") from None
        if "error" in answer:
            raise AssertionError(f"chromium refused {method}: {answer['error']}")
        return answer.get("result", {})

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=True)
        return result.get("result", {}).get("value")

    def goto(self, url: str) -> None:
        self.call("Page.navigate", {"url": url}, session=True)
        deadline = time.monotonic() + self.timeout_s
        while self.evaluate("document.readyState + ' ' + location.href") != f"complete {url}":
            if time.monotonic() > deadline:
                raise AssertionError(f"{url} did not load within {self.timeout_s:g}s")
            time.sleep(0.05)

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", {"format": "png"}, session=True)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (AssertionError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        self.log.close()
