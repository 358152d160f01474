"""The results database: workloads (canonical kernels) apart from measurements.

SQLite in WAL mode; every finished measurement is committed at once, so an
interrupted optimization resumes with everything it measured. A measurement is keyed
by (workload hash, target, backend, tile config, tool versions); ``host`` says where it
was measured ("" here, "rpc:HOST:PORT" for an RPC server, docs/distributed.md).

Schema history: 1 initial; 2 adds ``measurements.host`` (an old database is migrated
in place on open: the column is added, empty).

Concurrency: several korch processes may share one database. SQLite serialises the
writers (the busy timeout makes a writer wait, not fail), every write is one
autocommitted statement, and on a measurement's unique key the first successful row
wins: ``record`` keeps an existing "ok" row (a failed one is replaced) and returns the
row that stands, so two processes that measure the same kernel at once both use the
same number, and each sees what a later run will read.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time
from pathlib import Path

SCHEMA_VERSION = 2

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
    host TEXT NOT NULL DEFAULT '',
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
    status: str  # "ok" | "failed" | "wrong" | "timeout" | "crash" | "oom"
    median_us: float | None
    times_us: tuple[float, ...] = ()
    error: str = ""
    host: str = ""  # where it was measured: "" locally, "rpc:HOST:PORT" on an RPC server

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class ResultsDB:
    def __init__(self, path: str | Path):
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(self.path, timeout=60.0, isolation_level=None)
        self.conn.execute("PRAGMA busy_timeout=60000")
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.executescript(_SCHEMA)
        row = self.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None:
            self.conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        elif int(row[0]) == 1:
            self._migrate_1_to_2()
        elif int(row[0]) != SCHEMA_VERSION:
            raise RuntimeError(f"results database {self.path} has schema {row[0]}, korch needs {SCHEMA_VERSION}")

    def _migrate_1_to_2(self) -> None:
        # One transaction; a concurrent korch may have migrated it first.
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            cols = {r[1] for r in self.conn.execute("PRAGMA table_info(measurements)")}
            if "host" not in cols:
                self.conn.execute("ALTER TABLE measurements ADD COLUMN host TEXT NOT NULL DEFAULT ''")
            self.conn.execute("UPDATE meta SET value='2' WHERE key='schema_version'")
            self.conn.execute("COMMIT")
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self.conn.close()

    def add_workload(self, hash_: str, kind: str, n_primitives: int, text: str) -> None:
        self.conn.execute("INSERT OR IGNORE INTO workloads VALUES (?, ?, ?, ?)", (hash_, kind, n_primitives, text))

    def record(self, m: Measurement) -> Measurement:
        """Store ``m`` (committed at once); returns the row that stands (see the module note)."""
        self.conn.execute(
            "INSERT INTO measurements (workload, target, backend, config, versions, status,"
            " median_us, times_us, error, created, host) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (workload, target, backend, config, versions) DO UPDATE SET"
            " status=excluded.status, median_us=excluded.median_us, times_us=excluded.times_us,"
            " error=excluded.error, created=excluded.created, host=excluded.host"
            " WHERE measurements.status != 'ok'",
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
                m.host,
            ),
        )
        return self.lookup(m.workload, m.target, m.backend, m.config, m.versions) or m

    def lookup(self, workload: str, target: str, backend: str, config: str, versions: str) -> Measurement | None:
        row = self.conn.execute(
            "SELECT status, median_us, times_us, error, host FROM measurements WHERE workload=? AND target=?"
            " AND backend=? AND config=? AND versions=?",
            (workload, target, backend, config, versions),
        ).fetchone()
        if row is None:
            return None
        return Measurement(
            workload,
            target,
            backend,
            config,
            versions,
            row[0],
            row[1],
            tuple(json.loads(row[2] or "[]")),
            row[3] or "",
            row[4] or "",
        )

    def count(self, status: str | None = None) -> int:
        if status is None:
            return self.conn.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]
        return self.conn.execute("SELECT COUNT(*) FROM measurements WHERE status=?", (status,)).fetchone()[0]

    def failures(self) -> list[tuple[str, str, str, str]]:
        return self.conn.execute(
            "SELECT workload, backend, status, error FROM measurements WHERE status != 'ok'"
        ).fetchall()
