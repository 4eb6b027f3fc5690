"""Result bundles: `publish` writes Parquet + a manifest anyone can read; `pull` verifies every file before
anything is merged, refuses tampered, truncated, newer and hostile bundles naming the file and the reason, and adds
nothing the second time. Pulled from a folder, archives and a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import shutil
import stat
import tarfile
import threading
import time
import zipfile
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from quantbench.store import SCHEMA_VERSION, Store, queries
from quantbench.store.bundle import publish
from quantbench.store.fetch import FetchError, Limits
from quantbench.store.pull import BundleRefused, pull
from tests.test_transfer import counts, table, write_runs

PUBLISHER = {"quantbench_version": "0.1.0", "quantbench_git_rev": "abc123", "host": "h200-box"}


def make_bundle(tmp_path: Path, out: str = "bundle", n: int = 2, host: str = "h200-box", gpu: str | None = "NVIDIA H200"):
    src = Store(tmp_path / f"src-{out}.duckdb")
    ids = write_runs(src, host, n=n, gpu=gpu)
    published = publish(src, tmp_path / out, ids, [], name=f"test-{out}", selection={"gpu": "hopper"},
                        publisher=PUBLISHER)
    return src, ids, published


def rewrite_manifest(folder: Path, change) -> None:
    path = folder / "manifest.json"
    m = json.loads(path.read_text())
    change(m)
    path.write_text(json.dumps(m, indent=2))


def nothing_merged(store: Store, before: list[int] | None = None) -> None:
    if before is None:
        assert not store.path.exists(), "a refused bundle must not create the store"
    else:
        assert counts(store) == before and queries.bundles(store).empty


# -- publish ----------------------------------------------------------------------------------------------------
def test_a_bundle_is_plain_parquet_and_json_readable_without_quantbench(tmp_path):
    src, ids, published = make_bundle(tmp_path)
    folder = published.path
    assert sorted(p.name for p in folder.iterdir()) == ["answers.parquet", "latencies.parquet", "manifest.json",
                                                       "runs.parquet"]
    m = json.loads((folder / "manifest.json").read_text())
    assert m["format"] == "quantbench-bundle" and m["schema_version"] == SCHEMA_VERSION
    assert m["quantbench"] == {"version": "0.1.0", "commit": "abc123"} and m["publisher"]["host"] == "h200-box"
    assert sorted(m["run_ids"]) == sorted(ids) and m["load_ids"] == []
    assert m["machines"][0]["gpu_name"] == "NVIDIA H200" and m["machines"][0]["runs"] == 2
    assert m["suites"] == [{"suite_id": None, "suite_hash": "s1", "runs": 2}]
    assert published.digest == hashlib.sha256((folder / "manifest.json").read_bytes()).hexdigest()
    for f in m["files"]:  # every file's sha256, size and rows, checkable with the standard library and pyarrow
        data = (folder / f["name"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == f["sha256"] and len(data) == f["bytes"]
        assert pq.read_table(folder / f["name"]).num_rows == f["rows"]
    answers = pd.read_parquet(folder / "answers.parquet")
    assert len(answers) == 4 and set(answers["top"]) == {"b"} and list(answers["options"].iloc[0]) == ["a", "b"]


def test_publish_never_writes_over_a_bundle(tmp_path):
    src, ids, published = make_bundle(tmp_path)
    with pytest.raises(Exception, match="already exists"):
        publish(src, published.path, ids, [], name="again", selection={}, publisher=PUBLISHER)
    with pytest.raises(Exception, match="nothing to publish"):
        publish(src, tmp_path / "empty", [], [], name="none", selection={}, publisher=PUBLISHER)
    assert not list(tmp_path.glob(".*partial*"))


# -- pull: verified, whole, idempotent ---------------------------------------------------------------------------
def test_pull_merges_every_row_records_the_bundle_and_a_second_pull_adds_nothing(tmp_path):
    src, ids, published = make_bundle(tmp_path)
    dst = Store(tmp_path / "third.duckdb")
    first = pull(dst, str(published.path), expect_sha256=published.digest)
    assert (first.runs_added, first.answers_added, first.latencies_added) == (2, 4, 6)
    for name in ("runs", "answers", "latencies"):
        pd.testing.assert_frame_equal(table(dst, name), table(src, name))
    sources = queries.run_sources(dst).set_index("run_id")
    assert set(sources["bundle"]) == {"test-bundle"} and set(sources["bundle_host"]) == {"h200-box"}
    before = counts(dst)
    again = pull(dst, str(published.path))
    assert again.runs_added == 0 and again.runs_present == 2 and again.already_pulled_at is not None
    assert counts(dst) == before and len(queries.bundles(dst)) == 1


def test_a_bundle_with_runs_the_store_already_has_adds_only_the_new_ones(tmp_path):
    src, ids, published = make_bundle(tmp_path)
    first = publish(src, tmp_path / "first", ids[:1], [], name="first", selection={}, publisher=PUBLISHER)
    dst = Store(tmp_path / "third.duckdb")
    assert pull(dst, str(first.path)).runs_added == 1
    summary = pull(dst, str(published.path))
    assert summary.runs_added == 1 and summary.runs_present == 1
    items = dst.read("SELECT CAST(item_id AS VARCHAR) AS id, added FROM bundle_items WHERE bundle_id = ?",
                     [summary.bundle_id]).set_index("id")["added"]
    assert items.to_dict() == {ids[0]: False, ids[1]: True}
    sources = queries.run_sources(dst).set_index("run_id")["bundle"].to_dict()
    assert sources == {ids[0]: "first", ids[1]: "test-bundle"}  # a run's source is the bundle that brought it


@pytest.mark.parametrize("tamper, file, reason", [
    (lambda f: _flip_byte(f / "answers.parquet"), "answers.parquet", "differs from the manifest"),
    (lambda f: _cut(f / "latencies.parquet"), "latencies.parquet", "cut short"),
    (lambda f: (f / "notes.txt").write_text("hi"), "notes.txt", "not in the manifest"),
    (lambda f: (f / "runs.parquet").unlink(), "runs.parquet", "missing"),
    (lambda f: rewrite_manifest(f, lambda m: m.update(schema_version=SCHEMA_VERSION + 1)), "manifest.json",
     f"schema version {SCHEMA_VERSION + 1}, newer than this quantbench"),
    (lambda f: rewrite_manifest(f, lambda m: m.update(format_version=99)), "manifest.json", "upgrade quantbench"),
    (lambda f: rewrite_manifest(f, lambda m: m["run_ids"].pop()), "runs.parquet", "not the 1 the manifest lists"),
    (lambda f: (f / "manifest.json").write_text("{not json"), "manifest.json", "not JSON"),
])
def test_a_tampered_truncated_or_newer_bundle_is_refused_naming_the_file_with_nothing_merged(
        tmp_path, tamper, file, reason):
    _, _, published = make_bundle(tmp_path)
    tamper(published.path)
    dst = Store(tmp_path / "third.duckdb")
    mine = write_runs(dst, "laptop", n=1)
    before = counts(dst)
    with pytest.raises(BundleRefused) as refused:
        pull(dst, str(published.path))
    assert f": {file}: " in str(refused.value) and reason in str(refused.value)
    assert "nothing was merged" in str(refused.value)
    nothing_merged(dst, before)
    assert dst.read("SELECT CAST(run_id AS VARCHAR) AS r FROM runs")["r"].tolist() == mine


def test_a_consistent_forgery_is_caught_by_the_announced_digest_and_by_the_row_checks(tmp_path):
    _, ids, published = make_bundle(tmp_path)
    folder = published.path
    # answers of a run the bundle does not carry, with the manifest's checksums made to match
    answers = pd.read_parquet(folder / "answers.parquet")
    answers["run_id"] = answers["run_id"].astype(str)
    answers.loc[0, "run_id"] = "01a20000-0000-7000-8000-000000000000"
    answers.to_parquet(folder / "answers.parquet")
    data = (folder / "answers.parquet").read_bytes()

    def forge(m):
        f = next(f for f in m["files"] if f["name"] == "answers.parquet")
        f.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    rewrite_manifest(folder, forge)
    dst = Store(tmp_path / "third.duckdb")
    with pytest.raises(BundleRefused, match="manifest.json: its sha256 is .* not the .* you gave"):
        pull(dst, str(folder), expect_sha256=published.digest)
    with pytest.raises(BundleRefused, match="answers.parquet: rows of 1 run_id.* not among the bundle's"):
        pull(dst, str(folder))
    nothing_merged(dst)


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _cut(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


# -- archives, and hostile ones ---------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".tar", ".tar.gz", ".zip"])
def test_archives_round_trip(tmp_path, suffix):
    src, ids, published = make_bundle(tmp_path, out=f"b{suffix}")
    assert published.path.is_file()
    dst = Store(tmp_path / "third.duckdb")
    assert pull(dst, str(published.path)).runs_added == 2
    assert pull(dst, str(published.path)).runs_added == 0


def _tar(path: Path, members: list[tarfile.TarInfo], data: dict[str, bytes] | None = None) -> Path:
    with tarfile.open(path, "w") as tar:
        for m in members:
            payload = (data or {}).get(m.name, b"")
            if m.isreg():
                m.size = len(payload)
            tar.addfile(m, io.BytesIO(payload) if m.isreg() else None)
    return path


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    m = tarfile.TarInfo(name)
    m.type, m.linkname = kind, link
    return m


@pytest.mark.parametrize("member, reason", [
    (_member("../evil.parquet"), "unsafe path"),
    (_member("/tmp/evil.parquet"), "unsafe path"),
    (_member("bundle/../../evil.parquet"), "unsafe path"),
    (_member("bundle/manifest.json", tarfile.SYMTYPE, "/etc/passwd"), "is a symlink"),
    (_member("bundle/runs.parquet", tarfile.LNKTYPE, "/etc/passwd"), "is a hard link"),
    (_member("bundle/fifo", tarfile.FIFOTYPE), "not a regular file"),
    (_member("a/b/c/runs.parquet"), "nested"),
])
def test_hostile_tar_members_are_refused_before_anything_is_written(tmp_path, member, reason):
    evil = _tar(tmp_path / "evil.tar", [_member("bundle/manifest.json"), member],
                {"bundle/manifest.json": b"{}", member.name: b"x" * 10})
    dst = Store(tmp_path / "third.duckdb")
    with pytest.raises(FetchError, match=reason):
        pull(dst, str(evil))
    assert not (tmp_path / "evil.parquet").exists() and not Path("/tmp/evil.parquet").exists()
    nothing_merged(dst)


def test_hostile_zip_members_are_refused(tmp_path):
    dst = Store(tmp_path / "third.duckdb")
    traversal = tmp_path / "traversal.zip"
    with zipfile.ZipFile(traversal, "w") as z:
        z.writestr("manifest.json", "{}")
        z.writestr("../evil.parquet", "x")
    with pytest.raises(FetchError, match="unsafe path"):
        pull(dst, str(traversal))
    link = tmp_path / "link.zip"
    with zipfile.ZipFile(link, "w") as z:
        info = zipfile.ZipInfo("runs.parquet")
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        z.writestr(info, "/etc/passwd")
    with pytest.raises(FetchError, match="is a symlink"):
        pull(dst, str(link))
    nothing_merged(dst)


def test_a_zip_bomb_is_refused_from_its_header_without_unpacking(tmp_path):
    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("runs.parquet", b"\0" * (64 << 20))  # 64 MiB of zeros: ~64 KB packed
    assert bomb.stat().st_size < 1 << 20
    dst = Store(tmp_path / "third.duckdb")
    started = time.monotonic()
    with pytest.raises(FetchError, match="expands .*-fold .* zip bomb"):
        pull(dst, str(bomb))
    assert time.monotonic() - started < 2.0
    nothing_merged(dst)


def test_an_archive_over_the_size_limit_is_refused(tmp_path):
    _, _, published = make_bundle(tmp_path, out="big.tar.gz")
    dst = Store(tmp_path / "third.duckdb")
    with pytest.raises(FetchError, match="over the limit of 1,000"):
        pull(dst, str(published.path), Limits(max_bytes=1000))
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(published.path.read_bytes()[:-200])
    with pytest.raises(FetchError, match="not a whole tar archive|cut short"):
        pull(dst, str(cut))
    nothing_merged(dst)


# -- over HTTP, from a real server on 127.0.0.1 ------------------------------------------------------------------
class _Handler(http.server.SimpleHTTPRequestHandler):
    """Serves a folder; /stall/ never answers its body in time; /liar/ promises more bytes than it sends."""

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.startswith("/stall/"):
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            time.sleep(3)
            return
        if self.path.startswith("/liar/"):
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            self.wfile.write(b"PK\x03\x04" + b"\0" * 100)
            self.wfile.flush()
            self.close_connection = True
            return
        super().do_GET()


@pytest.fixture
def http_root(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: _Handler(*a, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_pull_from_a_local_http_server_folder_and_archive_then_nothing_the_second_time(tmp_path, http_root):
    root, base = http_root
    src, ids, published = make_bundle(tmp_path, out="h200")
    shutil.copytree(published.path, root / "h200")
    _, cpu_ids, tar = make_bundle(tmp_path, out="cpu.tar", host="laptop", gpu=None)
    shutil.copy(tar.path, root / "cpu.tar")
    dst = Store(tmp_path / "third.duckdb")
    assert pull(dst, f"{base}/h200/", expect_sha256=published.digest).runs_added == 2
    assert pull(dst, f"{base}/cpu.tar").runs_added == 2
    before = counts(dst)
    assert pull(dst, f"{base}/h200/manifest.json").runs_added == 0
    assert pull(dst, f"{base}/cpu.tar").runs_added == 0
    assert counts(dst) == before
    by_bundle = queries.run_sources(dst).groupby("bundle")["pulled_from"].first().to_dict()
    assert by_bundle == {"test-h200": f"{base}/h200/", "test-cpu.tar": f"{base}/cpu.tar"}


def test_a_tampered_file_on_the_server_is_refused_with_nothing_merged(tmp_path, http_root):
    root, base = http_root
    _, _, published = make_bundle(tmp_path, out="h200")
    shutil.copytree(published.path, root / "h200")
    _flip_byte(root / "h200" / "runs.parquet")
    dst = Store(tmp_path / "third.duckdb")
    with pytest.raises(BundleRefused, match="runs.parquet: sha256 .* differs from the manifest's"):
        pull(dst, f"{base}/h200/")
    nothing_merged(dst)


def test_downloads_are_size_limited_time_limited_and_must_arrive_whole(tmp_path, http_root):
    root, base = http_root
    _, _, published = make_bundle(tmp_path, out="h200.tar")
    shutil.copy(published.path, root / "h200.tar")
    dst = Store(tmp_path / "third.duckdb")
    with pytest.raises(FetchError, match=r"\(Content-Length\), over the 1,000 bytes"):
        pull(dst, f"{base}/h200.tar", Limits(max_bytes=1000))
    started = time.monotonic()
    with pytest.raises(FetchError, match="no answer within 0.5 s"):
        pull(dst, f"{base}/stall/x.tar", Limits(timeout_s=0.5))
    assert time.monotonic() - started < 2.5
    with pytest.raises(FetchError, match="the download failed"):
        pull(dst, f"{base}/liar/x.zip")
    with pytest.raises(FetchError, match="answered 404"):
        pull(dst, f"{base}/nothing-here.tar")
    nothing_merged(dst)


def test_the_cli_pulls_twice_and_refuses_in_one_line(tmp_path, http_root):
    from typer.testing import CliRunner

    from quantbench.cli import app

    root, base = http_root
    _, _, published = make_bundle(tmp_path, out="h200")
    shutil.copytree(published.path, root / "h200")
    db = ["--db", str(tmp_path / "third.duckdb")]
    first = CliRunner().invoke(app, ["pull", f"{base}/h200/", *db], env={"COLUMNS": "300"})
    assert first.exit_code == 0, first.output
    assert "2 new runs (4 answers, 6 timed decisions), 0 already here" in first.output
    again = CliRunner().invoke(app, ["pull", f"{base}/h200/", *db], env={"COLUMNS": "300"})
    assert "0 new runs" in again.output and "nothing to add" in again.output
    _cut(root / "h200" / "answers.parquet")
    bad = CliRunner().invoke(app, ["pull", f"{base}/h200/", *db], env={"COLUMNS": "300"})
    assert bad.exit_code == 2
    assert bad.output.strip().startswith(f"error: {base}/h200/: answers.parquet: ") and "cut short" in bad.output
    assert counts(Store(tmp_path / "third.duckdb")) == [2, 4, 6]


def test_pull_shows_two_machines_of_one_host_name_as_two_lines(tmp_path, http_root):
    """pull's "What came in" names machines as merge's does: two machines both called localhost were one line."""
    from typer.testing import CliRunner

    from quantbench.cli import app
    from tests.test_transfer import came_in

    root, base = http_root
    src = Store(tmp_path / "lab.duckdb")
    ids = write_runs(src, "localhost", n=2, gpu="NVIDIA H200", machine_id="3d1219c7aa55bb66")
    ids += write_runs(src, "localhost", n=1, gpu="NVIDIA H200", machine_id="9f00e1d2bb77cc88")
    publish(src, root / "two", ids, [], name="two", selection={}, publisher=PUBLISHER)
    pulled = CliRunner().invoke(app, ["pull", f"{base}/two/", "--db", str(tmp_path / "mine.duckdb")],
                                env={"COLUMNS": "300"})
    assert pulled.exit_code == 0, pulled.output
    assert came_in(pulled.stdout) == {"NVIDIA H200 (localhost, machine 3d1219c7)": 2,
                                      "NVIDIA H200 (localhost, machine 9f00e1d2)": 1}
