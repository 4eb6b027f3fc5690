"""Each media part decoded once: a bounded cache of decoded parts keyed by what the part holds.

A run prepares its suite's records again and again (the cold decision, warm-up, the suite, the latency phase),
and each preparation decoded every part anew (a PNG, an mp4 through FFmpeg); a server decoded each part in its
media gate (to refuse what does not decode with a 4xx before queueing) and again in the engine. Both now go
through `decode_once`: the key is the part's content (sha256 of its data URI or of its frames and rate; for a
suite's `path`, the file's resolved path, size and modification time) with the limits it was checked under, so a
second decode of the same bytes under the same limits is a dictionary hit, and a part that fails decodes (and
fails) every time. The cache is process-wide, thread-safe and bounded by the decoded bytes it holds (least
recently used first out), so a server under many distinct pictures keeps a bounded amount."""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from quantbench.limits import Limits
from quantbench.protocol.media import Decoded, DecodedAudio, DecodedImage, decode_part, resolve_media_path

DEFAULT_MAX_BYTES = 512 * 2**20


def _nbytes(item: Decoded) -> int:
    if isinstance(item, DecodedImage):
        width, height = item.image.size
        return width * height * 3
    if isinstance(item, DecodedAudio):
        return item.samples.nbytes
    return sum(frame.nbytes for frame in item.frames)


class DecodeCache:
    """Decoded media parts by content, at most `max_bytes` of them; `decodes` counts the real decodes."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES):
        self.max_bytes = max_bytes
        self.decodes = 0
        self._items: OrderedDict[tuple, tuple[Decoded, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def decode(self, field: str, part: dict[str, Any], limits: Limits, *, base: Path | None = None) -> Decoded:
        """decode_part(field, part, limits, base=base), from the cache when these bytes were decoded before."""
        key = _key(field, part, limits, base)
        if key is not None:
            with self._lock:
                hit = self._items.get(key)
                if hit is not None:
                    self._items.move_to_end(key)
            if hit is not None:
                item = hit[0]
                return item if item.field == field else dataclasses.replace(item, field=field)
        item = decode_part(field, part, limits, base=base)  # outside the lock: decoding takes milliseconds
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
        return item

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


def decode_once(field: str, part: dict[str, Any], limits: Limits, *, base: Path | None = None) -> Decoded:
    """decode_part through the process's shared cache."""
    return SHARED.decode(field, part, limits, base=base)


def decode_media_once(state: dict[str, Any], limits: Limits, *, base: Path | None = None) -> list[Decoded]:
    """Every media part of `state`, decoded (or found decoded), in order: decode_media through the cache."""
    from quantbench.protocol import media_parts

    return [decode_once(field, part, limits, base=base) for field, part in media_parts(state)]
