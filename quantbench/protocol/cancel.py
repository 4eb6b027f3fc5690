"""Cooperative cancellation of the work done for one request, on whatever thread does it.

A Python thread cannot be stopped from outside, so work that may be abandoned (decoding a request's media,
preparing it) asks at its natural steps whether its request still wants it: `check_cancelled()` between frames,
between blocks of audio, between phases. The server's preparation pool (quantbench.server.prepare) gives each job a
CancelToken, set when the request's deadline passes or its client disconnects; the decoders in
quantbench.protocol.media call `check_cancelled()`, which raises Cancelled on a cancelled token and does nothing
when the thread works for no token (a `quantbench run`, a test calling a decoder directly).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class Cancelled(Exception):
    """The request this work was for no longer wants it (its deadline passed, its client left)."""


class CancelToken:
    """Set once, from any thread, to cancel the work done for one request; `deadline` (time.monotonic) cancels
    it by itself when it passes."""

    def __init__(self, deadline: float | None = None):
        self.deadline = deadline
        self.why: str | None = None
        self._event = threading.Event()

    def cancel(self, why: str) -> None:
        if not self._event.is_set():
            self.why = why
            self._event.set()

    @property
    def cancelled(self) -> bool:
        if not self._event.is_set() and self.deadline is not None and time.monotonic() > self.deadline:
            self.cancel("its deadline passed")
        return self._event.is_set()

    def check(self) -> None:
        if self.cancelled:
            raise Cancelled(self.why)


_working = threading.local()


@contextmanager
def working_for(token: CancelToken | None) -> Iterator[None]:
    """While inside, `check_cancelled()` on this thread checks `token`."""
    previous = getattr(_working, "token", None)
    _working.token = token
    try:
        yield
    finally:
        _working.token = previous


def check_cancelled() -> None:
    """Raise Cancelled when the work this thread is doing has been cancelled; nothing otherwise."""
    token = getattr(_working, "token", None)
    if token is not None:
        token.check()
