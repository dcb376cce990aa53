"""A small Chrome DevTools Protocol driver for Debian's /usr/bin/chromium.

Playwright is not in the lock file, so the browser tests drive headless Chromium
directly: start it with --remote-debugging-port=0, read the port it picked, and speak
CDP over a minimal RFC 6455 WebSocket client (standard library only, loopback only).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
# Headless, no network beyond loopback, nothing the browser would fetch on its own: every
# browser test's Chromium (this driver's and Playwright's, tests/browser/conftest.py).
HEADLESS_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
FLAGS = [
    *HEADLESS_FLAGS,
    "--disable-extensions",
    "--disable-default-apps",
    "--mute-audio",
    "--window-size=1024,900",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
]


class WebSocket:
    def __init__(self, url: str, timeout: float = 30.0) -> None:
        assert url.startswith("ws://127.0.0.1:") or url.startswith("ws://localhost:"), url
        hostport, _, path = url[len("ws://") :].partition("/")
        host, _, port = hostport.partition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(1)
            if not chunk:
                raise ConnectionError("websocket handshake closed")
            head += chunk
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise ConnectionError(head.decode(errors="replace"))

    def _recv_exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("websocket closed")
            buf += chunk
        return buf

    def send(self, text: str) -> None:
        payload = text.encode()
        header = bytes([0x81])
        n = len(payload)
        if n < 126:
            header += bytes([0x80 | n])
        elif n < 65536:
            header += bytes([0x80 | 126]) + struct.pack("!H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack("!Q", n)
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(header + mask + masked)

    def recv(self) -> str:
        message = b""
        while True:
            b1, b2 = self._recv_exact(2)
            opcode, fin = b1 & 0x0F, b1 & 0x80
            n = b2 & 0x7F
            if n == 126:
                n = struct.unpack("!H", self._recv_exact(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", self._recv_exact(8))[0]
            mask = self._recv_exact(4) if b2 & 0x80 else None
            data = self._recv_exact(n)
            if mask:
                data = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
            if opcode == 0x8:
                raise ConnectionError("websocket closed by peer")
            if opcode in (0x9, 0xA):  # ping/pong: ignore (Chromium does not require pong)
                continue
            message += data
            if fin:
                return message.decode()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class Browser:
    """One headless Chromium with one page."""

    def __init__(self) -> None:
        self.profile = tempfile.mkdtemp(prefix="verity-chromium-")
        self.proc = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.quit()
                raise RuntimeError("chromium did not start")
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        targets = json.load(
            urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10)
        )
        page = next(t for t in targets if t["type"] == "page")
        self.ws = WebSocket(page["webSocketDebuggerUrl"])
        self._id = 0
        self.events: list[dict] = []
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.call("Log.enable")

    def call(self, method: str, **params):
        self._id += 1
        my_id = self._id
        self.ws.send(json.dumps({"id": my_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == my_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def _wait_event(self, name: str, timeout: float = 20.0) -> dict:
        for i, e in enumerate(self.events):  # it may have arrived during a call()
            if e["method"] == name:
                return self.events.pop(i)
        deadline = time.monotonic() + timeout
        self.ws.sock.settimeout(timeout)
        while time.monotonic() < deadline:
            msg = json.loads(self.ws.recv())
            if "method" in msg:
                if msg["method"] == name:
                    return msg
                self.events.append(msg)
        raise TimeoutError(name)

    def goto(self, url: str) -> None:
        self.events = [e for e in self.events if e["method"] != "Page.loadEventFired"]
        self.call("Page.navigate", url=url)
        self._wait_event("Page.loadEventFired")

    def submit(self, selector: str) -> None:
        """Submit a form and wait for the next page load."""
        self.evaluate(f"document.querySelector({json.dumps(selector)}).submit()")
        self._wait_event("Page.loadEventFired")

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(result["exceptionDetails"])
        return result["result"].get("value")

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))

    def csp_violations(self) -> list[str]:
        out = []
        for e in self.events:
            if e["method"] == "Log.entryAdded":
                text = e["params"]["entry"].get("text", "")
                if "Content Security Policy" in text or "Content-Security-Policy" in text:
                    out.append(text)
        return out

    def quit(self) -> None:
        if getattr(self, "ws", None):
            self.ws.close()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
        shutil.rmtree(self.profile, ignore_errors=True)


def available() -> bool:
    return os.path.exists(CHROMIUM)
