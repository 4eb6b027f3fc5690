"""Where results live on this machine: your own store, the store pulled bundles go to, and the results shipped with
quantbench. Your runs and everyone else's are kept apart, and read side by side.

- **Your store**: `$QUANTBENCH_DB` if set, else `$QUANTBENCH_HOME/results.duckdb`. `run`, `demo`, `sweep` and `load`
  write there by default. `QUANTBENCH_HOME` defaults to `$XDG_DATA_HOME/quantbench`, else
  `~/.local/share/quantbench`: never a git-tracked file, so a run never makes the checkout "dirty".
- **Pulled results**: `$QUANTBENCH_HOME/pulled.duckdb`, where `quantbench pull` merges bundles by default.
- **Shipped results**: the `results.duckdb` beside the quantbench package in a checkout (the H200 and CPU rows this
  project measured), read only; `$QUANTBENCH_SHIPPED` names another file, or none when set empty.

Readers (`report`, `runs`, `compare`, `recommend`, `load-runs`, the dashboard) read your store with the other two
beside it, unless a store is named (`--db` or `$QUANTBENCH_DB`): then that one alone, and `--shared` adds the others.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

HOME_ENV = "QUANTBENCH_HOME"
DB_ENV = "QUANTBENCH_DB"
SHIPPED_ENV = "QUANTBENCH_SHIPPED"
OWN_NAME = "results.duckdb"
PULLED_NAME = "pulled.duckdb"

# Kinds of source a reader reads, in the order a run found in two of them is taken from (yours first).
YOURS, PULLED, SHIPPED, GIVEN = "yours", "pulled", "shipped", "given"


@dataclass(frozen=True)
class Source:
    """One store a reader reads: its file, what it is (YOURS, PULLED, SHIPPED, or GIVEN: named by --db) and a label
    a person reads ("your store", "shipped with quantbench")."""

    path: Path
    kind: str

    @property
    def label(self) -> str:
        return {YOURS: "your store", PULLED: "pulled bundles", SHIPPED: "shipped with quantbench",
                GIVEN: "this store"}[self.kind]


def home() -> Path:
    """$QUANTBENCH_HOME, else $XDG_DATA_HOME/quantbench, else ~/.local/share/quantbench."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share") / "quantbench"


def named_db() -> Path | None:
    """The store named by $QUANTBENCH_DB, if any."""
    value = os.environ.get(DB_ENV)
    return Path(value).expanduser() if value else None


def own_db() -> Path:
    """Your store: $QUANTBENCH_DB, else $QUANTBENCH_HOME/results.duckdb."""
    return named_db() or home() / OWN_NAME


def pulled_db() -> Path:
    """Where `quantbench pull` merges bundles by default."""
    return home() / PULLED_NAME


def shipped_db() -> Path | None:
    """The results shipped with quantbench: $QUANTBENCH_SHIPPED (none when set empty), else the checkout's
    results.duckdb beside the package (an editable install or a clone), when there is one."""
    if SHIPPED_ENV in os.environ:
        value = os.environ[SHIPPED_ENV]
        return Path(value).expanduser() if value else None
    beside = Path(__file__).resolve().parents[2] / OWN_NAME
    return beside if beside.is_file() else None


def shared_sources() -> list[Source]:
    """The stores read beside yours: pulled bundles, then the shipped results (those that exist)."""
    found = [Source(pulled_db(), PULLED)]
    shipped = shipped_db()
    if shipped is not None:
        found.append(Source(shipped, SHIPPED))
    return [s for s in found if s.path.is_file()]


def reading(db: str | os.PathLike[str] | None, shared: bool | None) -> tuple[Source, list[Source]]:
    """(the store read first, the stores read beside it) for a reader given `--db` (or None) and `--shared` /
    `--mine` (None: neither). A named store (--db, $QUANTBENCH_DB) is read alone unless `shared`; your default
    store is read with the shared results beside it unless `shared` is False (`--mine`)."""
    named = Path(db).expanduser() if db else named_db()
    if named is not None:
        first = Source(named, GIVEN)
        beside = shared_sources() if shared else []
    else:
        first = Source(home() / OWN_NAME, YOURS)
        beside = [] if shared is False else shared_sources()
    resolved = first.path.resolve()
    return first, [s for s in beside if s.path.resolve() != resolved]
