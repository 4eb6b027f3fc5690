"""Claims: the runs of one store that a live sweep has taken, so that the same sweep started twice (two shells, a
cron job that overlaps itself) never runs a run twice, and a sweep that died never blocks one.

Beside the store sits a folder, `.<store file>.sweeps/`. A sweep holds `<owner>.lock` locked (flock) for its whole
life and lists what it claimed in `<owner>.json`: its pid, host, start and name, and the claim key of each run
(`PlannedRun.claim_key`), until that run is stored. The kernel drops the lock when the process ends, however it
ends (SIGKILL, a crash, the OOM killer), so a claim whose lock another process can take is a dead sweep's: it is
removed and its runs are free again. No timeout or pid guess decides it, so a live sweep's long run is never
taken from it and a dead one's claim never blocks. Every read or change of the folder happens under
`registry.lock`, so two sweeps starting at the same moment never both claim a run. Like DuckDB's own lock on the
store, this needs a filesystem whose locks work (a local disk; NFS carries flock as its own locks).
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import socket
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

from quantbench.errors import QuantbenchError


@dataclass(frozen=True)
class Holder:
    """A sweep that holds claims, as the sweep that meets them names it."""

    pid: int
    host: str
    started: str
    sweep: str

    def __str__(self) -> str:
        return f"another sweep (pid {self.pid} on {self.host}, started {self.started})"


@dataclass
class Found:
    """Of the keys asked about: those another live sweep holds, each with its holder; and the dead sweeps whose
    claims were removed on the way."""

    held: dict[str, Holder] = field(default_factory=dict)
    dropped: list[Holder] = field(default_factory=list)


def claims_folder(store: Path) -> Path:
    return store.absolute().parent / f".{store.name}.sweeps"


class Claims:
    """This sweep's claims on a store's runs: a context manager that holds its life lock while it is open."""

    def __init__(self, store: Path, sweep: str):
        self.folder = claims_folder(store)
        started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        self.me = Holder(os.getpid(), socket.gethostname(), started, sweep)
        self.owner = f"{self.me.host}-{self.me.pid}-{uuid.uuid4().hex[:8]}"
        self.mine: set[str] = set()
        self._life: IO[str] | None = None

    def __enter__(self) -> Claims:
        try:
            self.folder.mkdir(exist_ok=True)
        except OSError as e:
            raise QuantbenchError(f"cannot keep this sweep's claims in {self.folder} ({e.strerror or e}), so another "
                                  "sweep of the store could run its runs twice; give a --db in a folder this user "
                                  "may write") from None
        with self._registry():
            self._life = open(self._file("lock"), "w")  # held open, locked, until __exit__
            fcntl.flock(self._life, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file of its own: nobody else holds it
            self._write()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            with self._registry():
                for suffix in ("json", "lock"):
                    self._file(suffix).unlink(missing_ok=True)
        except OSError:  # the folder went away: so did the claims in it (and the error that ends the sweep stays)
            pass
        finally:
            if self._life is not None:
                self._life.close()  # drops the life lock: to any other sweep, these claims are a dead sweep's now

    def claim(self, keys: Iterable[str]) -> Found:
        """Claim each of `keys` that no other live sweep holds; the others come back with their holders."""
        keys = list(keys)
        with self._registry():
            found = self._others()
            self.mine.update(k for k in keys if k not in found.held)
            self._write()
        return Found({k: found.held[k] for k in keys if k in found.held}, found.dropped)

    def held(self, keys: Iterable[str]) -> Found:
        """Which of `keys` another live sweep holds now."""
        with self._registry():
            found = self._others()
        return Found({k: found.held[k] for k in keys if k in found.held}, found.dropped)

    def release(self, keys: Iterable[str]) -> None:
        """Give back runs this sweep has stored (ok or failed): a sweep waiting for them looks at the store."""
        with self._registry():
            self.mine.difference_update(keys)
            self._write()

    # -- the folder ------------------------------------------------------------------------------------------
    def _file(self, suffix: str) -> Path:
        return self.folder / f"{self.owner}.{suffix}"

    @contextmanager
    def _registry(self) -> Iterator[None]:
        """The folder to this process alone while it reads or changes the claims (held for milliseconds)."""
        with open(self.folder / "registry.lock", "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            yield  # closing the file drops the lock

    def _write(self) -> None:
        """This sweep's listing, replaced whole (a reader never sees half of it)."""
        listing = self._file("json")
        partial = listing.with_suffix(".partial")
        partial.write_text(json.dumps({"holder": asdict(self.me), "runs": sorted(self.mine)}))
        partial.replace(listing)

    def _others(self) -> Found:
        """Every key a live sweep other than this one holds; each dead sweep's listing and lock are removed."""
        found = Found()
        for listing in sorted(self.folder.glob("*.json")):
            if listing.stem == self.owner:
                continue
            try:
                claim = json.loads(listing.read_text())
                holder, runs = Holder(**claim["holder"]), list(claim["runs"])
            except (OSError, ValueError, KeyError, TypeError):
                continue  # not a listing this code wrote (each is replaced whole): not a claim
            if _alive(listing.with_suffix(".lock")):
                found.held.update(dict.fromkeys(runs, holder))
            else:
                found.dropped.append(holder)
                listing.unlink(missing_ok=True)
                listing.with_suffix(".lock").unlink(missing_ok=True)
        return found


def _alive(lock: Path) -> bool:
    """Whether the sweep that owns `lock` still runs: it holds the lock for its whole life, and the kernel drops
    it when the process ends."""
    try:
        fh = open(lock)
    except FileNotFoundError:
        return False
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False  # taken: its owner is gone (closing the file drops it again)
