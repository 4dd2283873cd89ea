"""A real browser for the report tests: headless Chromium (Debian's ``chromium``) driven over the
Chrome DevTools Protocol by a small WebSocket client written on the standard library (RFC 6455: the
handshake, masked client frames, the server's text frames), so nothing is downloaded at test time.

``open_page(path)`` loads a file and returns what a reader would meet: console errors and uncaught
exceptions, images that did not load, the page's title and text, and a full-page PNG screenshot."""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import secrets
import shutil
import socket
import struct
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

MAX_SHOT_HEIGHT = 12000  # px of a full-page screenshot (the reports are a few thousand)


def chromium_or_skip() -> str:
    """The Chromium binary. Missing: skipped on a developer's machine, a failure in CI (CI=1), where
    setup.sh --dev installs it: no browser test may be skipped there."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        message = "headless Chromium not installed (Debian: apt-get install -y chromium; scripts/setup.sh --dev)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def screenshot_folder() -> Path:
    """Where the browser tests leave their screenshots for a person to look at: $ALIGNCTL_SCREENSHOTS,
    else <tmp>/alignctl-screenshots (overwritten by each run)."""
    folder = Path(os.environ.get("ALIGNCTL_SCREENSHOTS") or Path(tempfile.gettempdir()) / "alignctl-screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class _WebSocket:
    """Just enough of a WebSocket client for CDP: text messages, masked as a client must."""

    def __init__(self, url: str, timeout: float) -> None:
        parts = urlparse(url)
        self.sock = socket.create_connection((parts.hostname, parts.port), timeout=timeout)
        key = base64.b64encode(secrets.token_bytes(16)).decode()
        request = (f"GET {parts.path} HTTP/1.1\r\nHost: {parts.hostname}:{parts.port}\r\nUpgrade: websocket\r\n"
                   f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
        self.sock.sendall(request.encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("the browser closed the connection during the handshake")
            head += chunk
        status, _, self.buffer = head.partition(b"\r\n\r\n")
        if b" 101 " not in status.split(b"\r\n")[0]:
            raise ConnectionError(f"WebSocket handshake refused: {status[:200]!r}")

    def send(self, text: str) -> None:
        payload = text.encode()
        mask = secrets.token_bytes(4)
        size = len(payload)
        header = bytes([0x81]) + (bytes([0x80 | size]) if size < 126 else
                                  bytes([0x80 | 126]) + struct.pack(">H", size) if size < 1 << 16 else
                                  bytes([0x80 | 127]) + struct.pack(">Q", size))
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def _read(self, count: int) -> bytes:
        while len(self.buffer) < count:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("the browser closed the connection")
            self.buffer += chunk
        data, self.buffer = self.buffer[:count], self.buffer[count:]
        return data

    def receive(self) -> str:
        message = b""
        while True:
            first, second = self._read(2)
            size = second & 0x7F
            if size == 126:
                size = struct.unpack(">H", self._read(2))[0]
            elif size == 127:
                size = struct.unpack(">Q", self._read(8))[0]
            payload = self._read(size)  # server frames are never masked
            opcode = first & 0x0F
            if opcode == 0x8:
                raise ConnectionError("the browser closed the connection")
            if opcode in (0x1, 0x0):
                message += payload
                if first & 0x80:
                    return message.decode()

    def close(self) -> None:
        self.sock.close()


@dataclass
class Page:
    title: str
    text: str
    errors: list[str] = field(default_factory=list)  # console errors, uncaught exceptions, failed loads
    broken_images: list[str] = field(default_factory=list)  # alt text of images that did not load
    images: int = 0
    screenshot: bytes = b""


class _Session:
    def __init__(self, ws: _WebSocket, deadline: float) -> None:
        self.ws, self.deadline, self.next_id = ws, deadline, 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while time.monotonic() < self.deadline:
            message = json.loads(self.ws.receive())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)
        raise TimeoutError(method)

    def wait_for(self, event: str) -> None:
        while time.monotonic() < self.deadline:
            if any(e.get("method") == event for e in self.events):
                return
            self.events.append(json.loads(self.ws.receive()))
        raise TimeoutError(event)

    def evaluate(self, expression: str) -> Any:
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                         awaitPromise=True)["result"].get("value")


def _errors(events: list[dict[str, Any]]) -> list[str]:
    found = []
    for event in events:
        params = event.get("params", {})
        if event.get("method") == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            found.append(f"{details.get('text', 'exception')} {details.get('exception', {}).get('description', '')}")
        elif event.get("method") == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            found.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))
        elif event.get("method") == "Log.entryAdded" and params["entry"].get("level") == "error":
            found.append(f"{params['entry'].get('text')} {params['entry'].get('url', '')}".strip())
    return found


def open_page(path: Path, *, width: int = 1280, timeout: float = 120.0) -> Page:
    """Load ``path`` in a fresh headless Chromium and report what a reader would meet."""
    chromium = chromium_or_skip()
    profile = tempfile.mkdtemp(prefix="alignctl-chromium-")
    process = subprocess.Popen([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                "--remote-debugging-port=0", "--remote-allow-origins=*", f"--user-data-dir={profile}",
                                "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    try:
        port = _devtools_port(process, deadline)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        connection.request("GET", "/json/list")
        target = next(t for t in json.loads(connection.getresponse().read()) if t.get("type") == "page")
        ws = _WebSocket(target["webSocketDebuggerUrl"], timeout)
        try:
            return _load(_Session(ws, deadline), path, width)
        finally:
            ws.close()
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(profile, ignore_errors=True)


def _devtools_port(process: subprocess.Popen[str], deadline: float) -> int:
    """Chromium prints 'DevTools listening on ws://127.0.0.1:PORT/...' on stderr once it is ready."""
    assert process.stderr is not None
    seen = []
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line and process.poll() is not None:
            raise RuntimeError(f"chromium exited with status {process.returncode}: {''.join(seen)[-2000:]}")
        seen.append(line)
        found = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
        if found:
            return int(found.group(1))
    raise TimeoutError("chromium did not start its DevTools server")


def _load(session: _Session, path: Path, width: int) -> Page:
    for domain in ("Page", "Runtime", "Log"):
        session.call(f"{domain}.enable")
    session.call("Emulation.setDeviceMetricsOverride", width=width, height=900, deviceScaleFactor=1, mobile=False)
    session.call("Page.navigate", url=path.resolve().as_uri())
    session.wait_for("Page.loadEventFired")
    # decode() settles every image (rejecting a broken one) before naturalWidth is read
    session.evaluate("Promise.allSettled([...document.images].map(i => i.decode()))")
    images = session.evaluate("JSON.stringify([...document.images].map(i => [i.alt || i.src.slice(0, 60), "
                              "i.complete && i.naturalWidth > 0]))")
    height = int(session.evaluate("Math.ceil(document.documentElement.scrollHeight)"))
    session.call("Emulation.setDeviceMetricsOverride", width=width, height=min(height, MAX_SHOT_HEIGHT),
                 deviceScaleFactor=1, mobile=False)
    shot = session.call("Page.captureScreenshot", format="png")["data"]
    marks = json.loads(images)
    return Page(title=session.evaluate("document.title"), text=session.evaluate("document.body.innerText"),
                errors=_errors(session.events), broken_images=[alt for alt, ok in marks if not ok],
                images=len(marks), screenshot=base64.b64decode(shot))
