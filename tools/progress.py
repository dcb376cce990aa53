"""Progress of long commands (soak, bench, fuzz, drills): one status line.

On a terminal the line is redrawn in place (rich, where installed); in CI or when the stream is not
a
terminal it is printed as a plain line at once and then every `plain_every` seconds (10 s),
so logs stay readable. `quiet=True` turns it off. It writes to stderr by default, so the
commands' final tables on stdout are unchanged.

    with Progress(lambda: f"{done}/{total} cases", label="fuzz") as progress:
        ...
        progress.note("VIOLATION: ...")   # printed at once, above the status line

The status callable runs on a background thread: keep it cheap and exception-free (an
exception is shown as the line instead of killing the command).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

PLAIN_EVERY_SECONDS = 10.0
TTY_REFRESH_PER_SECOND = 2


def _is_terminal(stream: TextIO) -> bool:
    if os.environ.get("CI") or os.environ.get("VERITY_PROGRESS") == "plain":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def progress_disabled() -> bool:
    """VERITY_PROGRESS=0 turns progress off everywhere (the same as --quiet)."""
    return os.environ.get("VERITY_PROGRESS", "").lower() in ("0", "off", "no", "false")


def fmt_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def eta(*, done: float, total: float, elapsed: float) -> str:
    """'~m:ss left' from the rate so far, '' when nothing is done yet."""
    if done <= 0 or total <= 0 or done >= total:
        return ""
    return f"~{fmt_duration(elapsed * (total - done) / done)} left"


class Progress:
    def __init__(
        self,
        status: Callable[[], str],
        *,
        label: str = "",
        quiet: bool = False,
        stream: TextIO | None = None,
        plain_every: float = PLAIN_EVERY_SECONDS,
        terminal: bool | None = None,
    ) -> None:
        self.status, self.label = status, label
        self.stream = stream or sys.stderr
        self.quiet = quiet or progress_disabled()
        self.terminal = _is_terminal(self.stream) if terminal is None else terminal
        self.plain_every = plain_every
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._live = None

    # -- the line ----------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def line(self) -> str:
        try:
            text = self.status()
        except Exception as exc:  # a status bug must not stop the command it reports on
            text = f"(progress unavailable: {type(exc).__name__}: {exc})"
        head = f"{self.label} " if self.label else ""
        return f"{head}[{fmt_duration(self.elapsed())}] {text}"

    def _plain(self, text: str) -> None:
        with self._lock:
            self.stream.write(f"[{time.strftime('%H:%M:%S')}] {text}\n")
            self.stream.flush()

    def note(self, message: str) -> None:
        """An event worth seeing now (a violation, a phase change): printed at once."""
        if self.quiet:
            return
        if self._live is not None:
            self._live.console.print(message, markup=False, highlight=False)
        else:
            self._plain(message)

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> Progress:
        if self.quiet or self._thread is not None:
            return self
        self.started = time.monotonic()
        if self.terminal:
            try:  # rich is a development dependency; a production image prints plain lines
                from rich.console import Console
                from rich.live import Live
                from rich.text import Text
            except ImportError:
                self.terminal = False
        if self.terminal:
            console = Console(file=self.stream, force_terminal=True)
            self._live = Live(
                get_renderable=lambda: Text(self.line(), no_wrap=True, overflow="ellipsis"),
                console=console,
                refresh_per_second=TTY_REFRESH_PER_SECOND,
                transient=False,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.start()
            return self
        self._thread = threading.Thread(target=self._plain_loop, name="progress", daemon=True)
        self._thread.start()
        return self

    def _plain_loop(self) -> None:
        self._plain(self.line())
        while not self._stop.wait(self.plain_every):
            self._plain(self.line())

    def stop(self) -> None:
        if self.quiet:
            return
        self._stop.set()
        if self._live is not None:
            self._live.stop()
            self._live = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
            self._plain(self.line() + " (done)")

    def __enter__(self) -> Progress:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
