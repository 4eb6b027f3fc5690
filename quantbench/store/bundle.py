"""Result bundles: a set of runs (and load runs) as plain Parquet files with a JSON manifest, readable without
quantbench (docs/BUNDLES.md describes the format). `quantbench publish` writes one (this module);
`quantbench pull` verifies one and merges it (quantbench.store.pull).

    manifest.json        format, versions, who published it and on what machines, the suites and models, every run
                         id and load id, and per file its table, row count, size and sha256
    runs.parquet         one row per run: the `runs` table's columns, as stored
    answers.parquet      one row per answer (run_id, record_id, question, options, probs, top, gold, …)
    latencies.parquet    one row per timed decision (run_id, seq, phase, model_ms, …)
    load_runs.parquet    one row per load run (only when the bundle holds load runs)
    load_steps.parquet   one row per step of a load run

Files are written to a private folder, hashed, and only then moved (or archived) to where they were asked:
a reader never sees half a bundle.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import shutil
import socket
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from quantbench.store import SCHEMA_VERSION, Store, StoreError

FORMAT = "quantbench-bundle"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
# file -> (table, key column, order of its rows)
FILES = {
    "runs.parquet": ("runs", "run_id", "created_at, run_id"),
    "answers.parquet": ("answers", "run_id", "run_id, record_id, question"),
    "latencies.parquet": ("latencies", "run_id", "run_id, seq"),
    "load_runs.parquet": ("load_runs", "load_id", "created_at, load_id"),
    "load_steps.parquet": ("load_steps", "load_id", "load_id, step"),
}
RUN_FILES = ("runs.parquet", "answers.parquet", "latencies.parquet")
LOAD_FILES = ("load_runs.parquet", "load_steps.parquet")
ARCHIVES = (".tar", ".tar.gz", ".tgz", ".zip")
MACHINE_COLUMNS = ("host", "gpu_name", "gpu_family", "gpu_cc", "gpu_memory_bytes", "driver_version", "cuda_version",
                   "cpu_model", "host_memory_bytes")
SOFTWARE_COLUMNS = ("python_version", "torch_version", "transformers_version", "auto_round_version", "modelopt_version",
                    "quantbench_version", "quantbench_git_rev")


class BundleError(StoreError):
    pass


@dataclass
class Published:
    path: Path  # the folder or archive written
    manifest: dict[str, Any]
    digest: str  # sha256 of manifest.json: what a reader checks with `quantbench pull --sha256`
    files: list[dict[str, Any]] = field(default_factory=list)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _q(text: str | Path) -> str:
    return "'" + str(text).replace("'", "''") + "'"


def _archive_kind(out: Path) -> str | None:
    name = out.name.lower()
    return next((s for s in ARCHIVES if name.endswith(s)), None)


def publish(store: Store, out: str | os.PathLike[str], run_ids: list[str], load_ids: list[str], *, name: str,
            selection: dict[str, Any], publisher: dict[str, Any]) -> Published:
    """Write the runs `run_ids` and load runs `load_ids` of `store` as a bundle at `out`: a new folder, or an
    archive when `out` ends in .tar, .tar.gz, .tgz or .zip. `selection` (the filters that chose them) and
    `publisher` (this quantbench's version and commit, this host) go into the manifest."""
    if not run_ids and not load_ids:
        raise BundleError("nothing to publish: no run matches the selection; `quantbench runs` lists the runs")
    out = Path(out)
    kind = _archive_kind(out)
    if out.exists() and not (kind is None and out.is_dir() and not any(out.iterdir())):
        raise BundleError(f"--out {out}: already exists; give a new folder or archive name (a bundle is never "
                          "written over another)")
    if not out.parent.is_dir():
        raise BundleError(f"--out {out}: the folder {out.parent} does not exist; create it first")
    try:
        work = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    except OSError as e:  # a read-only folder: was Python's traceback
        raise BundleError(f"--out {out}: cannot write in {out.parent} ({e.strerror or e}); give a folder this user "
                          "may write") from e
    try:
        files = _write_tables(store, work, run_ids, load_ids)
        manifest = _manifest(store, work, files, run_ids, load_ids, name=name, selection=selection,
                             publisher=publisher)
        text = json.dumps(manifest, indent=2, default=str) + "\n"
        (work / MANIFEST).write_text(text)
        digest = hashlib.sha256(text.encode()).hexdigest()
        if kind is None:
            work.chmod(0o755)
            if out.exists():
                out.rmdir()  # empty (checked above)
            work.rename(out)
        else:
            _archive(work, out, kind, name)
        return Published(out, manifest, digest, files)
    except (duckdb.IOException, OSError) as e:  # the disk filled up while the bundle was written
        raise BundleError(f"--out {out}: cannot write the bundle ({str(e).strip().splitlines()[0]}); free space on "
                          f"the disk of {out.parent}, or give another --out; nothing was published") from e
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _write_tables(store: Store, work: Path, run_ids: list[str], load_ids: list[str]) -> list[dict[str, Any]]:
    """One Parquet file per table, rows in a fixed order, with each file's rows, bytes and sha256."""
    wanted = [*(RUN_FILES if run_ids else ()), *(LOAD_FILES if load_ids else ())]
    files = []
    with store.connect(write=False, as_stored=True) as con:  # its own columns, as the manifest states its version
        con.execute("CREATE TEMP TABLE _runs AS SELECT unnest(?::UUID[]) AS run_id", [run_ids])
        con.execute("CREATE TEMP TABLE _loads AS SELECT unnest(?::UUID[]) AS load_id", [load_ids])
        for fname in wanted:
            table, key, order = FILES[fname]
            pick = "_runs" if key == "run_id" else "_loads"
            path = work / fname
            try:
                con.execute(f"COPY (SELECT * FROM {table} WHERE {key} IN (SELECT {key} FROM {pick}) ORDER BY {order}) "
                            f"TO {_q(path)} (FORMAT parquet, COMPRESSION zstd)")
            except duckdb.CatalogException as e:
                raise BundleError(f"{store.path} has no {table} table ({e}); `quantbench migrate --db {store.path}`") \
                    from None
            rows = con.execute(f"SELECT count(*) FROM read_parquet({_q(path)})").fetchone()[0]
            files.append({"name": fname, "table": table, "rows": int(rows), "bytes": path.stat().st_size,
                          "sha256": sha256_file(path)})
    return files


def _manifest(store: Store, work: Path, files: list[dict[str, Any]], run_ids: list[str], load_ids: list[str], *,
              name: str, selection: dict[str, Any], publisher: dict[str, Any]) -> dict[str, Any]:
    from quantbench.run.record import uuid7  # lazy: record imports pydantic models

    schema_version = Store(store.path).schema_version() or SCHEMA_VERSION  # the tables' columns are the store's

    con = duckdb.connect(":memory:")
    try:
        machines, software, suites, models = [], [], [], []
        runs = work / "runs.parquet"
        if runs.exists():
            src = f"read_parquet({_q(runs)})"
            for group, into in ((MACHINE_COLUMNS, machines), (SOFTWARE_COLUMNS, software)):
                cols = ", ".join(group)
                for row in con.execute(f"SELECT {cols}, count(*) AS runs FROM {src} GROUP BY ALL ORDER BY ALL"
                                       ).fetchall():
                    into.append(dict(zip([*group, "runs"], row, strict=True)))
            for row in con.execute(f"SELECT suite_id, suite_hash, count(*) FROM {src} GROUP BY ALL ORDER BY ALL"
                                   ).fetchall():
                suites.append({"suite_id": row[0], "suite_hash": row[1], "runs": row[2]})
            for row in con.execute(f"SELECT model_id, weights, count(*) FROM {src} GROUP BY ALL ORDER BY ALL"
                                   ).fetchall():
                models.append({"model_id": row[0], "weights": row[1], "runs": row[2]})
            ordered = [str(r[0]) for r in con.execute(f"SELECT run_id FROM {src}").fetchall()]
        else:
            ordered = []
        loads = work / "load_runs.parquet"
        servers = []
        if loads.exists():
            servers = [{"server_model": r[0], "server_variant": r[1], "server_gpu": r[2], "host": r[3],
                        "load_runs": r[4]} for r in con.execute(
                f"SELECT server_model, server_variant, server_gpu, host, count(*) FROM read_parquet({_q(loads)}) "
                "GROUP BY ALL ORDER BY ALL").fetchall()]
            load_order = [str(r[0]) for r in con.execute(f"SELECT load_id FROM read_parquet({_q(loads)})").fetchall()]
        else:
            load_order = []
    finally:
        con.close()
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "bundle_id": str(uuid7()),
        "name": name,
        "published_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "schema_version": schema_version,
        "quantbench": {"version": publisher.get("quantbench_version"), "commit": publisher.get("quantbench_git_rev")},
        "publisher": {"host": publisher.get("host") or socket.gethostname(), "from_store": store.path.name},
        "selection": selection,
        "machines": machines,
        "software": software,
        "suites": suites,
        "models": models,
        "load_servers": servers,
        "run_ids": ordered,
        "load_ids": load_order,
        "files": files,
    }


def _archive(work: Path, out: Path, kind: str, name: str) -> None:
    """The bundle's files in one folder (named after the bundle) inside a .tar / .tar.gz / .zip."""
    top = "".join(c if c.isalnum() or c in "._-" else "-" for c in name) or "bundle"
    partial = out.with_name(out.name + ".partial")
    members = [MANIFEST, *sorted(p.name for p in work.iterdir() if p.name != MANIFEST)]
    try:
        if kind == ".zip":
            with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as z:
                for member in members:
                    z.write(work / member, f"{top}/{member}")
        else:
            mode = "w:gz" if kind in (".tar.gz", ".tgz") else "w"
            with tarfile.open(partial, mode) as tar:
                for member in members:
                    info = tar.gettarinfo(str(work / member), f"{top}/{member}")
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    info.mode = 0o644
                    with open(work / member, "rb") as f:
                        tar.addfile(info, f)
        partial.replace(out)
    finally:
        partial.unlink(missing_ok=True)
