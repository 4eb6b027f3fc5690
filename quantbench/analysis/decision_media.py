"""The media a stored decision was asked about, found again for a person to look at.

The store keeps answers, not media: a run keeps its suite's id and hash (and, in its spec, the suite path it was
given). This module finds that suite again (a file the user points at, the path the run was given, or a built-in
suite by name), accepts it only when its hash is the run's (the same decisions, media bytes included), and decodes
one record's media parts through quantbench.protocol.media, with the run's own media limits. Every way this can
fail is a sentence that says what is missing and what to do; the dashboard shows it instead of the media.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from quantbench.errors import ConfigError, QuantbenchError
from quantbench.limits import DEFAULT_MAX_OPTIONS, MEDIA_LIMITS, Limits
from quantbench.protocol import omnisuite
from quantbench.protocol.media import Decoded, DecodedAudio, DecodedImage, DecodedVideo, decode_media
from quantbench.protocol.suite import BUILTIN_SUITE_ID, Suite, load_suite
from quantbench.store.records import StoredRun

__all__ = ["Decoded", "DecodedAudio", "DecodedImage", "DecodedVideo", "Limits", "SuiteLookup", "builtin_suite", "find_suite",
           "record_media", "run_limits", "run_suite_path"]


@dataclass(frozen=True)
class SuiteLookup:
    """The suite a run answered, found again (`suite`), or why not (`problem`); `tried` lists where it looked."""

    suite: Suite | None
    source: str = ""
    problem: str = ""
    tried: tuple[str, ...] = field(default_factory=tuple)


def run_suite_path(run: StoredRun) -> str | None:
    """The suite file the run was given (`--suite`, as typed; relative to where it ran), if any."""
    suite = (run.spec or {}).get("suite")
    return str(suite) if suite else None


def run_limits(run: StoredRun) -> Limits:
    """The limits the run checked and decoded its suite's media with (its `--max-media-*` flags)."""
    spec = run.spec or {}
    media = {k: int(v) for k, v in (spec.get("media_limits") or {}).items() if k in MEDIA_LIMITS}
    return Limits(max_options=int(spec.get("max_options") or DEFAULT_MAX_OPTIONS), **media)


def builtin_suite(suite_id: str, limits: Limits) -> Suite | None:
    """A suite quantbench generates itself, by its id (None: no built-in suite has that id): the text suite, or
    the omni media suite (generated into the cache on first use, as `quantbench run --family omni` does)."""
    if suite_id == BUILTIN_SUITE_ID:
        return load_suite(None, limits=limits)
    if omnisuite.is_builtin(suite_id):
        return load_suite(omnisuite.suite_path(suite_id), limits=limits)
    return None


def find_suite(suite_id: str | None, suite_hash: str | None, paths: list[str], limits: Limits) -> SuiteLookup:
    """The suite with this hash: from the first of `paths` (a file the user named, the run's own `--suite`) that
    loads with this hash, else the built-in suite of this id. A file of another hash is named in the problem (it
    holds other decisions, or other media under the same record ids: showing them would mislead)."""
    tried: list[str] = []
    problems: list[str] = []
    for raw in dict.fromkeys(p for p in paths if p):
        path = Path(raw).expanduser()
        tried.append(str(path))
        if not path.is_file():
            problems.append(f"`{path}` is not a file here")
            continue
        try:
            suite = load_suite(path, limits=limits)
        except QuantbenchError as e:
            problems.append(f"`{path}` does not load as a suite: {e}")
            continue
        if suite.hash == suite_hash:
            return SuiteLookup(suite, source=str(path), tried=tuple(tried))
        problems.append(f"`{path}` is suite {suite.id} with hash {suite.hash[:12]}…, not the "
                        f"{suite_hash and suite_hash[:12]}… the runs answered (other decisions or other media)")
    if suite_id:
        tried.append(f"built-in {suite_id}")
        try:
            suite = builtin_suite(suite_id, limits)
        except QuantbenchError as e:
            problems.append(f"the built-in suite {suite_id} does not load: {e}")
            suite = None
        if suite is not None:
            if suite.hash == suite_hash:
                return SuiteLookup(suite, source=f"built-in {suite_id}", tried=tuple(tried))
            problems.append(f"the built-in {suite_id} of this quantbench has hash {suite.hash[:12]}…, not the "
                            f"{suite_hash and suite_hash[:12]}… the runs answered (another quantbench version made it)")
        else:
            problems.append(f"{suite_id} is not a suite quantbench generates")
    why = "; ".join(problems) if problems else "the runs name no suite"
    return SuiteLookup(None, problem=(
        f"The store keeps answers, not media, and the suite these runs answered was not found: {why}. Give the "
        "path of its JSONL file (with its media files beside it) to show the media."), tried=tuple(tried))


def record_media(suite: Suite, record_id: str, limits: Limits) -> list[Decoded]:
    """Every media part of one record, decoded (images RGB, audio 16 kHz mono, video frames and rate). A record
    the suite lacks is a ConfigError; a part that does not decode raises the protocol's RequestError naming it."""
    record = next((r for r in suite.records if r.id == record_id), None)
    if record is None:
        raise ConfigError(f"record {record_id!r} is not in suite {suite.id} ({suite.path})")
    return decode_media(record.request.state, limits, base=suite.path.parent)
