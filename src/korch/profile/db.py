"""The results database: workloads (canonical kernels) apart from measurements.

SQLite in WAL mode; every finished measurement is committed at once, so an
interrupted optimization resumes with everything it measured. A measurement is keyed
by (workload hash, target, backend, tile config, tool versions).
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time
from pathlib import Path

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS workloads (
    hash TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    n_primitives INTEGER NOT NULL,
    text TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS measurements (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    workload TEXT NOT NULL REFERENCES workloads(hash),
    target TEXT NOT NULL,
    backend TEXT NOT NULL,
    config TEXT NOT NULL,
    versions TEXT NOT NULL,
    status TEXT NOT NULL,
    median_us REAL,
    times_us TEXT,
    error TEXT,
    created REAL NOT NULL,
    UNIQUE (workload, target, backend, config, versions)
);
"""


@dataclasses.dataclass(frozen=True)
class Measurement:
    workload: str
    target: str
    backend: str
    config: str
    versions: str
    status: str  # "ok" | "failed" | "wrong" | "timeout" | "crash"
    median_us: float | None
    times_us: tuple[float, ...] = ()
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class ResultsDB:
    def __init__(self, path: str | Path):
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(self.path, timeout=60.0, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.executescript(_SCHEMA)
        row = self.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None:
            self.conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        elif int(row[0]) != SCHEMA_VERSION:
            raise RuntimeError(f"results database {self.path} has schema {row[0]}, korch needs {SCHEMA_VERSION}")

    def close(self) -> None:
        self.conn.close()

    def add_workload(self, hash_: str, kind: str, n_primitives: int, text: str) -> None:
        self.conn.execute("INSERT OR IGNORE INTO workloads VALUES (?, ?, ?, ?)", (hash_, kind, n_primitives, text))

    def record(self, m: Measurement) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO measurements (workload, target, backend, config, versions, status,"
            " median_us, times_us, error, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                m.workload,
                m.target,
                m.backend,
                m.config,
                m.versions,
                m.status,
                m.median_us,
                json.dumps(list(m.times_us)),
                m.error[:2000],
                time.time(),
            ),
        )

    def lookup(self, workload: str, target: str, backend: str, config: str, versions: str) -> Measurement | None:
        row = self.conn.execute(
            "SELECT status, median_us, times_us, error FROM measurements WHERE workload=? AND target=?"
            " AND backend=? AND config=? AND versions=?",
            (workload, target, backend, config, versions),
        ).fetchone()
        if row is None:
            return None
        return Measurement(
            workload, target, backend, config, versions, row[0], row[1], tuple(json.loads(row[2] or "[]")), row[3] or ""
        )

    def count(self, status: str | None = None) -> int:
        if status is None:
            return self.conn.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]
        return self.conn.execute("SELECT COUNT(*) FROM measurements WHERE status=?", (status,)).fetchone()[0]

    def failures(self) -> list[tuple[str, str, str, str]]:
        return self.conn.execute(
            "SELECT workload, backend, status, error FROM measurements WHERE status != 'ok'"
        ).fetchall()
