"""Regenerate ql_core/db/schema_sqlite.sql: the SQLite schema at Alembic's head, as DDL.

    python tools/dump_schema.py [--check]

A fresh SQLite data dir is created from this file in one transaction (ql_core.db.fresh_schema),
without importing SQLAlchemy or Alembic. The file is produced here by running every migration on
an empty database and reading back ``sqlite_master`` (tables, indexes, views, triggers, each by
name: the order is stable) and the rows the migrations seed; run this tool after adding a
migration (tests/foundation/test_fresh_schema.py fails while the file is stale). ``--check`` exits 1
when the committed file differs from what the migrations produce.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ql_core.db.fresh_schema import SCHEMA_FILE, render  # noqa: E402
from ql_core.db.migrate import SCHEMA_HEAD, migrate_url  # noqa: E402


def migrated_ddl() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "ql.db"
        head = migrate_url(f"sqlite:///{db}")
        if head != SCHEMA_HEAD:
            sys.exit(f"Alembic's head is {head} but SCHEMA_HEAD says {SCHEMA_HEAD}: update ql_core/db/migrate.py")
        conn = sqlite3.connect(db)
        try:
            ddl = [sql for (sql,) in conn.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL "
                                                  "AND name NOT LIKE 'sqlite_%' ORDER BY CASE type WHEN 'table' "
                                                  "THEN 0 WHEN 'index' THEN 1 WHEN 'view' THEN 2 ELSE 3 END, name")]
            # Rows the migrations seed (ql_tally's counters); alembic_version is stamped on creation.
            tables = [name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                                       "AND name NOT LIKE 'sqlite_%' AND name != 'alembic_version' "
                                                       "ORDER BY name")]
            for table in tables:
                cur = conn.execute(f'SELECT * FROM "{table}" ORDER BY 1')
                columns = ", ".join(d[0] for d in cur.description)
                for row in cur.fetchall():
                    values = ", ".join(_literal(v) for v in row)
                    ddl.append(f"INSERT INTO {table} ({columns}) VALUES ({values})")
        finally:
            conn.close()
    return render(SCHEMA_HEAD, ddl)


def _literal(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    raise SystemExit(f"cannot render a seeded value of type {type(value).__name__}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed file is stale")
    args = parser.parse_args()
    text = migrated_ddl()
    if args.check:
        if SCHEMA_FILE.read_text(encoding="utf-8") != text:
            sys.exit(f"{SCHEMA_FILE} is stale: run python tools/dump_schema.py")
        return
    SCHEMA_FILE.write_text(text, encoding="utf-8")
    print(f"wrote {SCHEMA_FILE} ({SCHEMA_HEAD})")


if __name__ == "__main__":
    main()
