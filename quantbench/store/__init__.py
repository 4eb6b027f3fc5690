"""The results store: the only code that writes DuckDB.

DuckDB allows one read-write process or many read-only ones, so every connection here is short-lived: the
writer opens, writes one run in one transaction, closes (retrying while another process holds the lock); readers
open read-only per query. A dashboard left open therefore never blocks `quantbench run`.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
from pydantic import BaseModel

from quantbench.errors import QuantbenchError
from quantbench.paths import cache_dir
from quantbench.run.record import AnswerRow, LatencyRow, RunRecord, RunResult
from quantbench.store import check, composite
from quantbench.store.home import GIVEN, Source
from quantbench.store.nested import copy_nested
from quantbench.store.schema import MIGRATIONS, SCHEMA_VERSION, VIEWS

if TYPE_CHECKING:  # pandas is imported where rows are read or inserted: `run` refuses a bad --db without it
    import pandas as pd

DEFAULT_DB = "results.duckdb"  # the file name of your store, under $QUANTBENCH_HOME (quantbench.store.home)
LOCK_RETRY_S = 60.0
LOCK_SAY_S = 1.0  # a lock held this long is said (a run's write takes well under it)
LOCK_REMIND_S = 10.0
# Free disk asked for before a run: a new store holding one run of the built-in suite (436 answers) is 2.1 MB,
# as DuckDB allocates 256 KiB blocks per table, plus its write-ahead log; 16 MiB leaves room for its checkpoints.
MIN_FREE_BYTES = 16 << 20
UNSAVED_PREFIX = "quantbench-unsaved-"
# Errors in the rows themselves (a bug, not the disk): raised as they are, never kept aside.
DATA_ERRORS = (duckdb.ConstraintException, duckdb.ConversionException, duckdb.BinderException,
               duckdb.CatalogException, duckdb.ParserException, duckdb.InvalidInputException)


def default_db() -> str:
    """Your store: $QUANTBENCH_DB, else $QUANTBENCH_HOME/results.duckdb (quantbench.store.home)."""
    from quantbench.store.home import own_db

    return str(own_db())


class StoreError(QuantbenchError):
    pass


class StoreUnavailableError(StoreError):
    """The store's file cannot be opened or written (a missing folder, not a DuckDB file, a full disk)."""


class RecordMismatchError(StoreError):
    """A record's fields are not its table's columns (a bug in quantbench.run.record or the schema)."""


def _is_data_error(e: BaseException) -> bool:
    """An error in the rows themselves, here or in what led to it (DuckDB reports a refused row again, as an
    aborted transaction, at the next statement)."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, (*DATA_ERRORS, RecordMismatchError)):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


def _is_lock_error(e: Exception) -> bool:
    text = str(e).lower()
    return "lock" in text and ("could not set" in text or "conflicting" in text)


def _lock_wait(path: Path, e: Exception, waited: float) -> str:
    """One line while waiting for another process's lock on `path`: which process, how long so far, until when."""
    import re

    holder = re.search(r"\(PID (\d+)\)", str(e))
    who = f"process {holder.group(1)}" if holder else "another process"
    return f"waiting for {path}: {who} holds it (waited {waited:.0f} s of up to {LOCK_RETRY_S:.0f} s)"


def _open_error(path: Path, e: Exception) -> str:
    """Why `path` could not be opened, and what to do, in one line (DuckDB's own text names neither the setting
    that chose the file nor a fix): a file of another kind, a disk or folder that refuses writes, a held lock."""
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    where = "(the store chosen by --db, $QUANTBENCH_DB or $QUANTBENCH_HOME)"
    if "not a valid duckdb database" in text.lower():
        return (f"{path}: not a DuckDB store {where}: its first bytes are another file's; give another file, or "
                "move this one away")
    if any(w in text.lower() for w in ("read-only file system", "permission denied", "readonly")):
        return (f"cannot open {path} for writing {where}: {text}; give a file on a disk and in a folder this user "
                "may write, or fix its permissions")
    if "replaying wal" in text.lower():
        return f"cannot open {path}: {wal_fix(path, text)}"
    if _is_lock_error(e):
        return (f"cannot open {path}: another process holds it ({text}); wait for it (a run, a merge) to finish, "
                "or close what keeps it open")
    return f"cannot open {path}: {text}"


def wal_fix(path: Path, text: str) -> str:
    """A write-ahead log beside `path` that DuckDB cannot replay into it (one left from another copy of the file,
    or a file restored from a backup under an old log): what it is and the fix. DuckDB's own line said neither.
    The log is the one DuckDB names: read beside your store, it may be a pulled store's."""
    import re

    named = re.search(r'WAL file "([^"]+)"', text)
    wal = named.group(1) if named else f"{path}.wal"
    return (f"the write-ahead log {wal} cannot be replayed into its store ({text}): the log belongs to another copy "
            f"of the file, or the file was restored under an old log; move {wal} away (keep it until the store reads "
            "as you expect) and try again")


class Store:
    """One results store (a DuckDB file) that quantbench writes; with `beside`, other stores read with it as one
    (quantbench.store.composite: your store, then pulled bundles and the shipped results). Writes go to `path`
    only."""

    def __init__(self, path: str | os.PathLike[str] | None = None, beside: Sequence[Source] = (), kind: str = GIVEN):
        self.path = Path(path or default_db())
        self.kind = kind  # what `path` is to the reader: yours | given (quantbench.store.home)
        self.beside = tuple(beside)

    @property
    def sources(self) -> list[Source]:
        """Every store a read reads, in the order a run held by two of them is taken."""
        return [Source(self.path, self.kind), *self.beside]

    def exists(self) -> bool:
        """Whether any store this one reads exists yet."""
        return any(s.path.exists() for s in self.sources)

    def describe(self) -> str:
        """Where reads come from, for a person: "results.duckdb" or "your store X + shipped with quantbench Y"."""
        if not self.beside:
            return str(self.path)
        return " + ".join(f"{s.label} {s.path}" for s in self.sources if s.path.exists()) or str(self.path)

    # -- connections -----------------------------------------------------------------------------------------
    @contextmanager
    def connect(self, *, write: bool, as_stored: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        """A short-lived connection; a writer waits (up to LOCK_RETRY_S) while another process holds the file.
        A reader of a store older than this schema reads it as if migrated (quantbench.store.composite), unless
        `as_stored`: the file's own tables as they are (its schema version, its own columns)."""
        beside = self.beside and not write
        if not write and not (self.exists() if beside else self.path.exists()):
            raise StoreError(f"no results store at {self.path}; run `quantbench demo` or `quantbench run` first")
        con = self._open(lambda: composite.connect(self.sources) if beside
                         else duckdb.connect(str(self.path), read_only=not write))
        try:
            if not beside:  # a store read beside others is checked as composite attaches it
                version = self._check_whole(con)
                if not write and not as_stored and 0 < version < SCHEMA_VERSION:
                    # The queries name this schema's columns (answers.modality, runs.role): read directly, a store
                    # from before them failed inside `report` or `compare` with DuckDB's Binder Error traceback.
                    con.close()
                    con = self._open(lambda: composite.connect([Source(self.path, self.kind)]))
            if write:
                try:
                    self._migrate(con)
                except duckdb.Error as e:  # e.g. no space for the write-ahead log
                    raise StoreUnavailableError(f"cannot write {self.path}: {e}") from e
            try:
                yield con
            except duckdb.IOException as e:  # a block the file should hold cannot be read
                if write:
                    raise
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                raise StoreUnavailableError(f"cannot read {self.path}: {first}; the file is damaged or cut short: "
                                            f"{check.FIX}") from e
        finally:
            con.close()

    def _open(self, opener: Callable[[], duckdb.DuckDBPyConnection]) -> duckdb.DuckDBPyConnection:
        """`opener()`, retried (up to LOCK_RETRY_S) while another process holds the file, saying so (who, for how
        long) once a wait passes LOCK_SAY_S and then every LOCK_REMIND_S: before, a run's final write waited a
        silent minute after its progress bars had ended."""
        started = time.monotonic()
        said = None
        delay = 0.05
        while True:
            try:
                return opener()
            except composite.SourceVersionError as e:
                raise StoreError(str(e)) from None
            except duckdb.Error as e:
                waited = time.monotonic() - started
                if not _is_lock_error(e) or waited > LOCK_RETRY_S:
                    raise StoreUnavailableError(_open_error(self.path, e)) from e
                if waited >= LOCK_SAY_S and (said is None or waited - said >= LOCK_REMIND_S):
                    said = waited
                    print(_lock_wait(self.path, e, waited), file=sys.stderr, flush=True)
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _check_whole(self, con: duckdb.DuckDBPyConnection) -> int:
        """Refuse a file cut short, or missing tables or columns its schema version has (quantbench.store.check).
        Returns its schema version."""
        catalog = con.execute("SELECT current_database()").fetchone()[0]
        version = self.version_of(con)
        why = check.damage(con, catalog, self.path, version)
        if why:
            raise StoreUnavailableError(why)
        return version

    @staticmethod
    def version_of(con: duckdb.DuckDBPyConnection) -> int:
        has = con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = 'schema_version'"
        ).fetchone()[0]
        if not has:
            return 0
        row = con.execute("SELECT max(version) FROM schema_version").fetchone()
        return int(row[0] or 0)

    def _migrate(self, con: duckdb.DuckDBPyConnection, target: int = SCHEMA_VERSION) -> None:
        current = self.version_of(con)
        if current > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} has schema version {current}, newer than this quantbench ({SCHEMA_VERSION}); upgrade quantbench"
            )
        if current == 0:
            tables = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE NOT internal AND "
                                                "database_name = current_database() ORDER BY 1 LIMIT 4").fetchall()]
            if tables:  # made by another tool, or a quantbench store whose version table was dropped
                raise StoreError(f"{self.path} holds tables ({', '.join(tables)}) but no schema_version: not a "
                                 "quantbench store, or one whose version table was lost; give another --db (a new "
                                 "store is made by the next run), or restore it from a backup")
        if current < target:
            con.execute("BEGIN")
            try:
                con.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER, applied_at TIMESTAMPTZ)")
                for version in range(current + 1, target + 1):
                    con.execute(MIGRATIONS[version - 1])
                    con.execute("INSERT INTO schema_version VALUES (?, now())", [version])
                con.execute("COMMIT")
            except duckdb.Error:
                con.execute("ROLLBACK")
                raise
        if target == SCHEMA_VERSION:
            con.execute(VIEWS)

    def migrate(self, target: int = SCHEMA_VERSION) -> int:
        """Bring the file to `target` (tests make old stores with a lower target). Returns the version."""
        if target == SCHEMA_VERSION:  # opened as every writer opens it: a lock waited for, an error in one line
            with self.connect(write=True) as con:
                return self.version_of(con)
        con = duckdb.connect(str(self.path))
        try:
            self._migrate(con, target)
            return self.version_of(con)
        finally:
            con.close()

    def schema_version(self) -> int:
        """The schema version of `path` (the stores beside it are checked when read)."""
        if not self.path.exists():
            return 0
        with Store(self.path).connect(write=False, as_stored=True) as con:
            return self.version_of(con)

    # -- writing ---------------------------------------------------------------------------------------------
    def check_writable(self, min_free: int = MIN_FREE_BYTES) -> None:
        """Refuse, in well under a second and before any run starts, a store that the run's rows could not be
        written to: a missing folder, a file that is not a DuckDB store (or is newer than this quantbench), a disk
        with less than `min_free` bytes free. Creates nothing: a new store is made by the first write."""
        folder = self.path.absolute().parent
        fix = "or give another --db"
        if not folder.is_dir():
            raise StoreUnavailableError(f"--db {self.path}: the folder {folder} does not exist; create it {fix}")
        disk = os.statvfs(folder)
        free = disk.f_bavail * disk.f_frsize
        if free < min_free:
            raise StoreUnavailableError(
                f"--db {self.path}: only {free / 2**20:.1f} MiB free on its disk; quantbench wants {min_free / 2**20:.0f} "
                f"MiB free before a run (a new store with one run takes 2.1 MB); free some space {fix}")
        if self.path.exists():
            with self.connect(write=True):  # opens, migrates: the errors write_run would meet
                pass
        elif not os.access(folder, os.W_OK):
            raise StoreUnavailableError(f"--db {self.path}: the folder {folder} is not writable; fix its permissions {fix}")

    def write_run(self, result: RunResult) -> str:
        """Insert one run and its rows in a single transaction: a run is stored whole or not at all.

        When the store cannot take it (the disk filled up, the file went away, memory ran out, this process was
        told to stop mid-write), the run is kept whole in a side file that `quantbench merge` takes, and the
        StoreError says where. A row the schema refuses (a bug, not the disk) raises as it is.

        A failing writer never deletes or truncates the store: a new store is built whole in a file of this
        writer's own beside it and linked into place only once it holds the run (os.link fails if another writer
        made the store meanwhile: the run then goes into that one). The only file a failure removes is that
        private one, which no other process knows of and nothing was committed to. Removing the store itself
        when "this write began it" was wrong: two runs writing a new --db at once both saw no file, one
        committed, and the other, failing on the full disk, deleted the store with the first one's run."""
        try:
            return self._write_new(result) if not self.path.exists() else self._write_run(result)
        except (StoreUnavailableError, duckdb.Error, OSError, MemoryError) as e:  # a full disk fails in any statement
            if _is_data_error(e):
                raise
            raise StoreError(self._unsaved_message(result, e)) from e
        except BaseException as e:
            if isinstance(e, Exception):
                raise
            self._unsaved_message(result, e, announce=True)  # KeyboardInterrupt, SystemExit: keep it, then go on
            raise

    def _write_new(self, result: RunResult) -> str:
        """A new store holding `result`, built in a private file and linked in as `self.path`; into the store
        another writer made meanwhile, if one did."""
        private = self.path.with_name(f".{self.path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.new")
        try:
            try:
                run_id = Store(private)._write_run(result, checkpoint=True)
            except (StoreUnavailableError, duckdb.Error, OSError) as e:  # name the store, not the private file
                raise StoreUnavailableError(str(e).replace(str(private), f"{self.path} (new)")) from e
            if private.with_name(private.name + ".wal").exists():  # not all in the file: linking it would lose rows
                raise StoreUnavailableError(f"cannot write {self.path}: the new store's checkpoint did not finish")
            try:
                os.link(private, self.path)  # atomic, and never over an existing file
            except FileExistsError:
                return self._write_run(result)  # another writer made the store first: join it
            except OSError:  # a filesystem without hard links: write the store in place (never removed after)
                return self._write_run(result)
            return run_id
        finally:
            for own in (private, private.with_name(private.name + ".wal")):
                with contextlib.suppress(OSError):
                    own.unlink(missing_ok=True)

    def _unsaved_message(self, result: RunResult, error: BaseException, announce: bool = False) -> str:
        first = _what_happened(error)
        kept, tried = keep_unsaved(result, [self.path.absolute().parent])
        where = f" ({'; '.join(tried)})" if tried else ""
        if kept is None:
            message = (f"could not write run {result.run_id} to {self.path} ({first}), nor keep it in a side file "
                       f"anywhere{where}: the run is lost")
        else:
            skipped = f" (not in {'; '.join(tried)})" if tried else ""
            message = (f"could not write run {result.run_id} to {self.path} ({first}); the run is kept whole in "
                       f"{kept}{skipped}: once the store can be written, `quantbench merge {kept} --db {self.path}` "
                       "adds it")
        if announce:
            print(message, file=sys.stderr)
        return message

    def _write_run(self, result: RunResult, checkpoint: bool = False) -> str:
        run, answers, latencies = _rows(result)
        with self.connect(write=True) as con:
            con.execute("BEGIN")
            try:
                self._insert(con, "runs", [run])
                self._insert(con, "answers", answers)
                self._insert(con, "latencies", latencies)
                con.execute("COMMIT")
            except Exception:
                with contextlib.suppress(duckdb.Error):  # an aborted transaction refuses ROLLBACK: keep the cause
                    con.execute("ROLLBACK")
                raise
            if checkpoint:
                con.execute("CHECKPOINT")  # everything into the file itself, before it is linked into place
        return str(run["run_id"])

    @staticmethod
    def _insert(con: duckdb.DuckDBPyConnection, table: str, rows: list[dict[str, Any]],
                record: type[BaseModel] | None = None) -> None:
        """Insert `rows` (each a record's `model_dump()`). The record's fields must be exactly the table's columns:
        a field the table lacks, or a column no field fills, is an error here rather than a NULL."""
        cols = [c[0] for c in con.execute(f"DESCRIBE {table}").fetchall()]
        record = record or RECORDS[table]
        fields = set(record.model_fields)
        if fields != set(cols):
            raise RecordMismatchError(
                f"{table}: the record {record.__name__} and the table disagree: unknown column(s) "
                f"{sorted(fields - set(cols))}, column(s) with no field {sorted(set(cols) - fields)}; "
                "add a migration (quantbench/store/schema.py) or the field (quantbench/run/record.py)")
        if not rows:
            return
        import pandas as pd

        df = pd.DataFrame([{c: r[c] for c in cols} for r in rows], columns=cols)
        con.register("_incoming", df)
        try:
            con.execute(f"INSERT INTO {table} SELECT * FROM _incoming")
        finally:
            con.unregister("_incoming")

    # -- reading ---------------------------------------------------------------------------------------------
    def read(self, sql: str, params: list[Any] | None = None) -> pd.DataFrame:
        """Run a query on a read-only, short-lived connection. UUIDs come back as strings."""
        with self.connect(write=False) as con:
            df = con.execute(sql, params or []).fetchdf()
        for col in df.columns:
            if len(df) and isinstance(df[col].iloc[0], uuid.UUID):
                df[col] = df[col].astype(str)
        return df


def unsaved_folders() -> list[Path]:
    """Where a run that its store could not take is kept, after the store's own folder: the cache, then /tmp."""
    import tempfile

    return [cache_dir() / "unsaved", Path(tempfile.gettempdir())]


def keep_unsaved(result: RunResult, first: list[Path] | None = None) -> tuple[Path | None, list[str]]:
    """Write one run, whole, as a `quantbench export` Parquet file (what `quantbench merge` takes) in the first
    folder that can hold it. Built in an in-memory DuckDB: nothing is written to the failing disk but the file.
    Returns (the file or None, why each folder failed)."""
    run, answers, latencies = _rows(result)
    tried = []
    for folder in [*(first or []), *unsaved_folders()]:
        out = folder / f"{UNSAVED_PREFIX}{run['run_id']}.parquet"
        partial = out.with_name(out.name + ".partial")
        con = None
        try:
            folder.mkdir(parents=True, exist_ok=True)
            con = duckdb.connect(":memory:")
            Store(":memory:")._migrate(con)
            Store._insert(con, "runs", [run])
            Store._insert(con, "answers", answers)
            Store._insert(con, "latencies", latencies)
            copy_nested(con, partial, SCHEMA_VERSION)
            partial.replace(out)
            return out, tried
        except (duckdb.Error, OSError, MemoryError) as e:
            tried.append(f"{folder}: {(str(e).strip().splitlines() or [type(e).__name__])[0]}")
            with contextlib.suppress(OSError):  # a read-only folder refuses even this: the next folder is tried
                partial.unlink(missing_ok=True)
        finally:
            if con is not None:
                con.close()
    return None, tried


def _what_happened(error: BaseException) -> str:
    """The first line of an error, or, for a stop signal or Ctrl-C (which carry only an exit code), what it was:
    'stopped by SIGTERM while writing', not '143'."""
    if isinstance(error, KeyboardInterrupt):
        return "stopped by Ctrl-C (SIGINT) while writing"
    if isinstance(error, SystemExit):
        code = error.code if isinstance(error.code, int) else None
        if code is not None and code > 128:
            import signal

            try:
                return f"stopped by {signal.Signals(code - 128).name} while writing"
            except ValueError:
                pass
        return f"the process was exiting ({error.code}) while writing"
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


RECORDS: dict[str, type[BaseModel]] = {"runs": RunRecord, "answers": AnswerRow, "latencies": LatencyRow}


def _rows(result: RunResult) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """The rows of the three tables, as inserted: the JSON columns as text, the run's id on every row."""
    run = result.run.model_dump()
    for key in ("spec", "extra"):
        if not isinstance(run[key], str | None):
            run[key] = json.dumps(run[key], default=str)
    rid = run["run_id"]
    answers = [{**a.model_dump(), "run_id": rid} for a in result.answers]
    latencies = [{**lat.model_dump(), "run_id": rid} for lat in result.latencies]
    return run, answers, latencies
