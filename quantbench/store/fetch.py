"""A bundle's files, from wherever `quantbench pull` is pointed, copied into a private folder before anything reads
them: a folder, a .tar (.tar.gz, .tgz) or .zip archive, or an http(s) URL (an archive, or a bundle folder served
over HTTP: its manifest.json, then each file the manifest names, beside it).

Nothing here trusts the source. Archives are never extracted by the library (no `extractall`): each member is
checked, then its bytes are copied by this code into the private folder under a plain name. Refused, naming the
member and the reason: an absolute path or one with `..`, a symlink, hard link, device or FIFO, more than
`max_files` members, more than `max_bytes` in all (declared or actually read), a zip member compressed more than
`max_ratio` to one (a zip bomb), an encrypted zip member, two members of one name. Downloads go through httpx,
streamed: a Content-Length over the limit is refused before the body is read, a body that grows past it is cut off
and refused, each read waits at most `timeout_s` and the whole pull `deadline_s`. The folder holds only regular
files at its top level (or in one folder inside an archive); what they contain is quantbench.store.pull's to check.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO
from urllib.parse import urljoin, urlsplit

from quantbench.store import StoreError

MANIFEST = "manifest.json"
CHUNK = 1 << 16
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")  # a file name a bundle may hold: no path, no dot files


class FetchError(StoreError):
    """The source could not be read, or is refused (hostile or over a limit). Nothing was written to the store."""


@dataclass(frozen=True)
class Limits:
    max_bytes: int = 2 << 30  # the whole bundle, downloaded and unpacked
    max_files: int = 64
    max_ratio: float = 200.0  # a zip member's uncompressed / compressed size (zstd Parquet compresses ~1-10x)
    timeout_s: float = 30.0  # connect, and each read of an HTTP response
    deadline_s: float = 600.0  # the whole download


@contextmanager
def staged(source: str, limits: Limits | None = None) -> Iterator[Path]:
    """The bundle's files copied into a private temporary folder (removed afterwards); yields that folder."""
    tmp = Path(tempfile.mkdtemp(prefix="quantbench-pull-"))
    try:
        folder = tmp / "bundle"
        folder.mkdir()
        budget = _Budget(limits or Limits(), source)
        if urlsplit(source).scheme in ("http", "https"):
            _from_url(source, folder, tmp, budget)
        elif urlsplit(source).scheme not in ("", "file") and not Path(source).exists():
            raise FetchError(f"{source}: pull takes a folder, a .tar or .zip file, or an http(s):// URL")
        else:
            path = Path(source.removeprefix("file://")).expanduser()
            if path.is_symlink():
                raise FetchError(f"{source}: a symlink; give the bundle itself")
            if path.is_dir():
                _from_folder(path, folder, budget)
            elif path.is_file():
                _from_archive(path, folder, budget, source)
            else:
                raise FetchError(f"{source}: no such file or folder")
        yield folder
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class _Budget:
    """Bytes and files left, and the deadline, shared by everything one pull reads."""

    def __init__(self, limits: Limits, source: str) -> None:
        self.limits, self.source = limits, source
        self.left = limits.max_bytes
        self.files = 0
        self.deadline = time.monotonic() + limits.deadline_s

    def take_file(self, name: str) -> None:
        self.files += 1
        if self.files > self.limits.max_files:
            raise FetchError(f"{self.source}: more than {self.limits.max_files} files (at {name}); a bundle holds a "
                             "manifest and a few Parquet files")

    def take(self, n: int, what: str) -> None:
        self.left -= n
        if self.left < 0:
            raise FetchError(f"{self.source}: {what} goes past the limit of {self.limits.max_bytes:,} bytes for a "
                             "bundle; raise --max-gib if you trust this source")
        if time.monotonic() > self.deadline:
            raise FetchError(f"{self.source}: still reading after {self.limits.deadline_s:g} s (at {what}); raise "
                             "--timeout or try again")


def _copy(stream: BinaryIO, dest: Path, budget: _Budget, what: str, cap: int | None = None) -> int:
    """Copy a stream into `dest` (a new file), counting every byte against the budget (and `cap`, a member's
    declared size: a member that yields more than it declared is refused)."""
    n = 0
    with open(dest, "xb") as out:
        while chunk := stream.read(CHUNK):
            n += len(chunk)
            if cap is not None and n > cap:
                raise FetchError(f"{budget.source}: {what} holds more than the {cap:,} bytes it declares")
            budget.take(len(chunk), what)
            out.write(chunk)
    return n


def _plain_name(member: str, source: str) -> str:
    """A member's file name, refusing any path that could land outside the folder: absolute, `..`, backslashes,
    NUL, more than one folder deep."""
    bad = (not member or "\x00" in member or "\\" in member or member.startswith("/")
           or re.match(r"^[A-Za-z]:", member) is not None)
    parts = PurePosixPath(member).parts
    if bad or ".." in parts or any(p in ("", ".") for p in member.rstrip("/").split("/")):
        raise FetchError(f"{source}: member {member!r} has an unsafe path (absolute, `..` or odd characters); a bundle "
                         "holds plain file names")
    if len(parts) > 2:
        raise FetchError(f"{source}: member {member!r} is nested {len(parts) - 1} folders deep; a bundle holds its "
                         "files at the top or in one folder")
    name = parts[-1]
    if not SAFE_NAME.match(name):
        raise FetchError(f"{source}: member {member!r}: the file name {name!r} is not a bundle's (letters, digits, "
                         "'.', '_', '-')")
    return name


def _one_folder(names: list[str], source: str) -> None:
    """An archive's files sit at its top or all in one folder."""
    tops = {PurePosixPath(n).parts[0] for n in names if len(PurePosixPath(n).parts) == 2}
    flat = [n for n in names if len(PurePosixPath(n).parts) == 1]
    if len(tops) > 1 or (tops and flat):
        raise FetchError(f"{source}: files in several folders ({', '.join(sorted(tops))}); a bundle archive holds "
                         "one bundle")


def _from_folder(path: Path, folder: Path, budget: _Budget) -> None:
    for entry in sorted(path.iterdir()):
        budget.take_file(entry.name)
        info = entry.lstat()
        if stat.S_ISLNK(info.st_mode):
            raise FetchError(f"{budget.source}: {entry.name} is a symlink; a bundle holds regular files only")
        if not stat.S_ISREG(info.st_mode):
            raise FetchError(f"{budget.source}: {entry.name} is not a regular file (a folder or a device); a bundle "
                             "holds its files at the top of its folder")
        name = _plain_name(entry.name, budget.source)
        if info.st_size > budget.left:
            budget.take(info.st_size, entry.name)
        with open(entry, "rb") as src:
            _copy(src, folder / name, budget, entry.name, cap=info.st_size)


def _from_archive(path: Path, folder: Path, budget: _Budget, shown: str) -> None:
    with open(path, "rb") as f:
        head = f.read(512)
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        _unzip(path, folder, budget)
    elif head[:2] == b"\x1f\x8b" or head[257:262] == b"ustar" or tarfile.is_tarfile(path):
        _untar(path, folder, budget)
    elif head.lstrip()[:1] == b"{":
        raise FetchError(f"{shown}: a JSON file; give the bundle's folder (the one holding {MANIFEST}), or an archive")
    else:
        raise FetchError(f"{shown}: neither a bundle folder nor a .tar / .zip archive")


def _untar(path: Path, folder: Path, budget: _Budget) -> None:
    try:
        with tarfile.open(path, mode="r:*") as tar:
            members = []
            for m in tar:  # headers only: nothing is read until every member is checked
                budget.take_file(m.name)
                if m.isdir():
                    _plain_name(m.name.rstrip("/") + "/x", budget.source)  # the folder's own path must be safe
                    continue
                if m.issym() or m.islnk():
                    raise FetchError(f"{budget.source}: member {m.name!r} is a {'symlink' if m.issym() else 'hard link'}"
                                     f" (to {m.linkname!r}); a bundle holds regular files only")
                if not m.isreg():
                    raise FetchError(f"{budget.source}: member {m.name!r} is not a regular file (a device, FIFO or "
                                     "other special member); a bundle holds regular files only")
                members.append((m, _plain_name(m.name, budget.source)))
            _one_folder([m.name for m, _ in members], budget.source)
            _no_duplicates([name for _, name in members], budget.source)
            declared = sum(m.size for m, _ in members)
            if declared > budget.limits.max_bytes:
                raise FetchError(f"{budget.source}: its members declare {declared:,} bytes, over the limit of "
                                 f"{budget.limits.max_bytes:,}; raise --max-gib if you trust this source")
            for m, name in members:
                stream = tar.extractfile(m)
                if stream is None:
                    raise FetchError(f"{budget.source}: member {m.name!r} cannot be read")
                got = _copy(stream, folder / name, budget, m.name, cap=m.size)
                if got != m.size:
                    raise FetchError(f"{budget.source}: member {m.name!r} ends after {got:,} of its {m.size:,} bytes: "
                                     "the archive is cut short")
    except (tarfile.TarError, EOFError, OSError) as e:
        if isinstance(e, FileExistsError):
            raise FetchError(f"{budget.source}: two members are named {Path(str(e.filename)).name}") from None
        raise FetchError(f"{budget.source}: not a whole tar archive ({e}); if it was cut short in a copy or a "
                         "download, fetch it again") from None


def _no_duplicates(names: list[str], source: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise FetchError(f"{source}: two members are named {name}; a bundle names each file once")
        seen.add(name)


def _unzip(path: Path, folder: Path, budget: _Budget) -> None:
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
            files = []
            for info in infos:
                budget.take_file(info.filename)
                mode = info.external_attr >> 16
                if stat.S_ISLNK(mode):
                    raise FetchError(f"{budget.source}: member {info.filename!r} is a symlink; a bundle holds regular "
                                     "files only")
                if info.is_dir():
                    _plain_name(info.filename.rstrip("/") + "/x", budget.source)
                    continue
                if stat.S_IFMT(mode) and not stat.S_ISREG(mode):  # no type bits: a plain file (zipfile writes 0o600)
                    raise FetchError(f"{budget.source}: member {info.filename!r} is not a regular file")
                if info.flag_bits & 0x1:
                    raise FetchError(f"{budget.source}: member {info.filename!r} is encrypted; a bundle is not")
                ratio = info.file_size / max(info.compress_size, 1)
                if info.file_size > (1 << 20) and ratio > budget.limits.max_ratio:
                    raise FetchError(f"{budget.source}: member {info.filename!r} expands {ratio:,.0f}-fold "
                                     f"({info.compress_size:,} → {info.file_size:,} bytes), over the "
                                     f"{budget.limits.max_ratio:g}-fold a bundle's files can take: refused as a zip bomb")
                files.append((info, _plain_name(info.filename, budget.source)))
            _one_folder([i.filename for i, _ in files], budget.source)
            _no_duplicates([name for _, name in files], budget.source)
            declared = sum(i.file_size for i, _ in files)
            if declared > budget.limits.max_bytes:
                raise FetchError(f"{budget.source}: its members declare {declared:,} bytes unpacked, over the limit of "
                                 f"{budget.limits.max_bytes:,}; raise --max-gib if you trust this source")
            for info, name in files:
                with z.open(info) as stream:  # stops at the declared size and checks the CRC at the end
                    _copy(stream, folder / name, budget, info.filename, cap=info.file_size)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, NotImplementedError) as e:
        raise FetchError(f"{budget.source}: not a whole zip archive ({e}); if it was cut short in a copy or a "
                         "download, fetch it again") from None


# -- http(s) -----------------------------------------------------------------------------------------------------
def _from_url(url: str, folder: Path, tmp: Path, budget: _Budget) -> None:
    """An archive URL, a manifest.json URL, or a folder URL (ending in /: its manifest.json)."""
    import httpx  # lazy: only a pull from a URL needs it

    timeout = httpx.Timeout(budget.limits.timeout_s)
    with httpx.Client(timeout=timeout, follow_redirects=True, max_redirects=5) as client:
        first = url if not url.endswith("/") else urljoin(url, MANIFEST)
        got = tmp / "download"
        _download(client, first, got, budget)
        with open(got, "rb") as f:
            head = f.read(512)
        if head.lstrip()[:1] != b"{":  # an archive: the budget already counted its bytes once
            budget.left += got.stat().st_size
            _from_archive(got, folder, budget, url)
            return
        budget.take_file(MANIFEST)
        shutil.move(got, folder / MANIFEST)
        for name in _listed_files(folder / MANIFEST, url):
            budget.take_file(name)
            _download(client, urljoin(first, name), folder / name, budget)


def _listed_files(manifest: Path, url: str) -> list[str]:
    """The file names a downloaded manifest lists, each a plain name (checked before any is fetched)."""
    import json

    try:
        files = json.loads(manifest.read_text())["files"]
        names = [f["name"] for f in files]
    except (ValueError, KeyError, TypeError) as e:
        raise FetchError(f"{url}: {MANIFEST} is not a bundle manifest ({type(e).__name__}: {e})") from None
    for name in names:
        if not isinstance(name, str) or not SAFE_NAME.match(name) or name == MANIFEST:
            raise FetchError(f"{url}: {MANIFEST} lists a file {name!r} that is not a plain file name; refused")
    _no_duplicates(names, url)
    return names


def _download(client, url: str, dest: Path, budget: _Budget) -> None:
    import httpx

    try:
        with client.stream("GET", url) as response:
            if response.status_code != 200:
                hint = (f"; give the bundle's folder URL ending in / (its {MANIFEST} is fetched) or its archive's URL"
                        if response.status_code == 404 else "")
                raise FetchError(f"{url}: the server answered {response.status_code}{hint}")
            length = response.headers.get("content-length")
            if length is not None and length.isdigit() and int(length) > budget.left:
                raise FetchError(f"{url}: {int(length):,} bytes (Content-Length), over the {budget.limits.max_bytes:,} "
                                 "bytes a bundle may take; raise --max-gib if you trust this source")
            with open(dest, "xb") as out:
                for chunk in response.iter_bytes(CHUNK):
                    budget.take(len(chunk), url)
                    out.write(chunk)
    except httpx.TimeoutException as e:
        raise FetchError(f"{url}: no answer within {budget.limits.timeout_s:g} s ({type(e).__name__}); try again "
                         "or raise --timeout") from None
    except httpx.HTTPError as e:
        raise FetchError(f"{url}: the download failed ({type(e).__name__}: {e}); nothing was merged") from None
    os.chmod(dest, 0o600)
