"""Each media part decoded once: a bounded cache of decoded parts keyed by what the part holds, and a request
scope that holds what one request decoded until it is prepared.

A run prepares its suite's records again and again (the cold decision, warm-up, the suite, the latency phase),
and each preparation decoded every part anew (a PNG, an mp4 through FFmpeg); a server decoded each part in its
media gate (to refuse what does not decode with a 4xx before queueing) and again in the engine. Both now go
through `decode_media_once`: the key is the part's content (sha256 of its data URI or of its frames and rate; for a
suite's `path`, the file's resolved path, size and modification time) with the limits it was checked under, so a
second decode of the same bytes under the same limits is a dictionary hit, and a part that fails decodes (and
fails) every time. The cache is process-wide, thread-safe and bounded by the decoded bytes it holds (least
recently used first out), so a server under many distinct pictures keeps a bounded amount.

A part larger than the cache's bound is never kept there, so without more the gate and the engine each decoded it
(the largest parts twice, the costliest case). `request_scope()` fixes that: while one request is prepared (on one
thread), every part decoded is held in the scope, whatever its size, and found there by the engine; the scope lets
go of them when the request is prepared. Before anything is decoded, every part's header is read and checked
(quantbench.protocol.media.probe_media: the per-part limits and the request's decoded bytes), and `check`, the
engine's own test of the headers (its context length from the tokens the headers imply), runs: a request over
either is refused having decoded nothing."""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from quantbench.limits import Limits
from quantbench.protocol.media import (
    Decoded,
    DecodedAudio,
    DecodedImage,
    MediaHeader,
    decode_part,
    probe_media,
    resolve_media_path,
)

# The decoded bytes the process keeps between requests. A server holds this much beside what its requests being
# prepared hold (each at most --max-request-decoded-bytes): 256 MiB keeps the suite's pictures of a run, or a
# server's recent ones, without doubling its memory.
DEFAULT_MAX_BYTES = 256 * 2**20


def _nbytes(item: Decoded) -> int:
    if isinstance(item, DecodedImage):
        width, height = item.image.size
        return width * height * 3
    if isinstance(item, DecodedAudio):
        return item.samples.nbytes
    return item.frames.nbytes


class DecodeCache:
    """Decoded media parts by content, at most `max_bytes` of them; `decodes` counts the real decodes."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES):
        self.max_bytes = max_bytes
        self.decodes = 0
        self._items: OrderedDict[tuple, tuple[Decoded, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def decode(self, field: str, part: dict[str, Any], limits: Limits, *, base: Path | None = None) -> Decoded:
        """decode_part(field, part, limits, base=base), from the request scope or the cache when these bytes were
        decoded before."""
        key = _key(field, part, limits, base)
        item = self.find(field, key)
        if item is not None:
            return item
        item = decode_part(field, part, limits, base=base)  # outside the lock: decoding takes milliseconds
        self.keep(key, item)
        return item

    def find(self, field: str, key: tuple | None) -> Decoded | None:
        """The part decoded under `key`, from this thread's request scope or the cache, named `field`; None."""
        if key is None:
            return None
        scope = getattr(_scope, "items", None)
        hit = scope.get(key) if scope is not None else None
        if hit is None:
            with self._lock:
                cached = self._items.get(key)
                if cached is not None:
                    self._items.move_to_end(key)
                    hit = cached[0]
        if hit is None:
            return None
        return hit if hit.field == field else dataclasses.replace(hit, field=field)

    def keep(self, key: tuple | None, item: Decoded) -> None:
        scope = getattr(_scope, "items", None)
        if scope is not None and key is not None:
            scope[key] = item
        with self._lock:
            self.decodes += 1
            if key is not None and key not in self._items:
                size = _nbytes(item)
                if size <= self.max_bytes:
                    self._items[key] = (item, size)
                    self._bytes += size
                    while self._bytes > self.max_bytes:
                        _, (_, dropped) = self._items.popitem(last=False)
                        self._bytes -= dropped

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0


def _key(field: str, part: dict[str, Any], limits: Limits, base: Path | None) -> tuple | None:
    """What identifies the part's decoded value (None: not cacheable, decode it every time)."""
    kind = part.get("type")
    if isinstance(part.get("data"), str):
        return (kind, "data", hashlib.sha256(part["data"].encode()).hexdigest(), limits)
    if isinstance(part.get("frames"), list) and all(isinstance(f, str) for f in part["frames"]):
        digest = hashlib.sha256()
        for frame in part["frames"]:
            digest.update(hashlib.sha256(frame.encode()).digest())
        return (kind, "frames", digest.hexdigest(), repr(part.get("fps")), limits)
    if isinstance(part.get("path"), str) and base is not None:
        try:
            target = resolve_media_path(base, part["path"], f"{field}.path")
        except Exception:  # noqa: BLE001 - decode_part raises the named error for it
            return None
        stat = target.stat()
        return (kind, "path", str(target), stat.st_size, stat.st_mtime_ns, limits)
    return None


SHARED = DecodeCache()  # the process's: a run's engine and a server's media gate and engine share it
_scope = threading.local()  # .items: {key: Decoded} of the request being prepared on this thread, or absent


@contextmanager
def request_scope() -> Iterator[dict]:
    """While inside, on this thread: every part decoded is held here (whatever its size) and found here again, so
    one request's gate and engine decode each part once; let go on leaving. Nested scopes share the outer one."""
    outer = getattr(_scope, "items", None)
    if outer is not None:
        yield outer
        return
    _scope.items = {}
    try:
        yield _scope.items
    finally:
        del _scope.items


def decode_once(field: str, part: dict[str, Any], limits: Limits, *, base: Path | None = None) -> Decoded:
    """decode_part through the request scope and the process's shared cache."""
    return SHARED.decode(field, part, limits, base=base)


HeaderCheck = Callable[[list[MediaHeader]], None]


def decode_media_once(state: dict[str, Any], limits: Limits, *, base: Path | None = None,
                      check: HeaderCheck | None = None) -> list[Decoded]:
    """Every media part of `state`, decoded (or found decoded), in order: decode_media through the scope and the
    cache. Unless every part is found, every part's header is read and checked first (the per-part limits, the
    request's decoded bytes), then `check(headers)` (an engine's context check, raising RequestError), all
    before the first part is decoded."""
    from quantbench.protocol import media_parts

    parts = media_parts(state)
    keys = [_key(field, part, limits, base) for field, part in parts]
    found = [SHARED.find(field, key) for (field, _), key in zip(parts, keys, strict=True)]
    if all(item is not None for item in found):
        return found  # type: ignore[return-value]
    headers = probe_media(state, limits, base=base)
    if check is not None:
        check(headers)
    out = []
    for (field, part), key, item in zip(parts, keys, found, strict=True):
        if item is None:
            item = decode_part(field, part, limits, base=base)
            SHARED.keep(key, item)
        out.append(item)
    return out
