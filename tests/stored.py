"""A stored run as a read gives it (quantbench.store.records.StoredRun), for tests of the rules that read runs:
the fields a test names, and what every stored run has (an id, a status, a time, a backend) filled in."""

from __future__ import annotations

import datetime as dt
from typing import Any

from quantbench.store.records import StoredRun

T0 = dt.datetime(2026, 11, 29, 12, tzinfo=dt.UTC)


def stored_run(**fields: Any) -> StoredRun:
    return StoredRun(**{"run_id": "r", "status": "ok", "created_at": T0, "backend": "bf16", **fields})
