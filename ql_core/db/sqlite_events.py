"""SQLite's run events, stored under their run's integer key (revision 0011_sqlite_compact).

On SQLite a run has a stable integer key, ``ql_run.run_key`` (an ``INTEGER PRIMARY KEY``: the
rowid, assigned in creation order and never renumbered, not even by ``VACUUM``), and an event's key
is ``run_key << EVENT_KEY_BITS | seq``. A run's events are then one range of ``ql_run_event``'s
rowid, side by side and appended at the table's right edge, and the table needs no index at all:
before, its ``(run_id, seq)`` key was an index B-tree on 36-character run ids, whose page splits
rewrote three sibling pages each and whose rows spilled into overflow pages at 512-byte pages — the
most frames of any B-tree per task (``bench/wal_pages.py``). ``run_id`` and ``seq`` stay columns, as
on PostgreSQL, and every statement here returns the columns of
:data:`ql_core.db.journal_sql.EVENT_COLUMNS` in their order.

:data:`INSERT_EVENT` takes the key from the run's row: an event of no run inserts nothing, and the
store fails the transaction when an INSERT did not insert its event (``edge_sqlite.store``). A
CHECK keeps ``seq`` in the key's low bits; the trigger ``ql_event_fixed`` refuses changing a key.
There is no foreign key to ``ql_run`` (its check on deleting a run would scan this table, which has
no index on ``run_id``): the history purge deletes a run's events before the run, in one
transaction. (A trigger checking each insert was not kept: ``sqlite3``'s statement trace repeats a
statement once per trigger it fires, which the tests' commit counts read.)

These statements are SQLite's own (PostgreSQL keeps ``(run_id, seq)``); the edge-sqlite store
(:mod:`ql_plugins.edge_sqlite.statements`) and the quick reads (:mod:`ql_core.db.sqlite_reads`)
use them.
"""

from __future__ import annotations

from .journal_sql import ENDED, EVENT_COLUMNS, qualified

__all__ = ["EVENT_KEY_BITS", "INSERT_EVENT", "SELECT_EVENTS", "PURGE_EVENTS"]

#: Bits of an event key below its run's key: a run has at most 2**20 - 1 events (seq from 1).
EVENT_KEY_BITS = 20
_SPAN = (1 << EVENT_KEY_BITS) - 1

_E_COLUMNS = qualified(EVENT_COLUMNS, "e")
#: The run's events: the run by its id, then one rowid range (never a scan).
_OF_RUN = (f"ql_run r CROSS JOIN ql_run_event e ON e.event_key BETWEEN r.run_key << {EVENT_KEY_BITS} "
           f"AND (r.run_key << {EVENT_KEY_BITS}) + {_SPAN} WHERE r.id = ?")

# The parameters of the shared INSERT_EVENT, in its order (run_id, seq, type, attempt_id, status,
# exit_code, reason, at_ms); a run that is not there: no row (the store checks the count).
INSERT_EVENT = (f"INSERT INTO ql_run_event (event_key, {EVENT_COLUMNS}) "
                f"SELECT (r.run_key << {EVENT_KEY_BITS}) + v.seq, {qualified(EVENT_COLUMNS, 'v')} "
                "FROM (SELECT ? AS run_id, ? AS seq, ? AS type, ? AS attempt_id, ? AS status, ? AS exit_code, "
                "? AS reason, ? AS at_ms) v JOIN ql_run r ON r.id = v.run_id")
SELECT_EVENTS = f"SELECT {_E_COLUMNS} FROM {_OF_RUN} ORDER BY e.event_key"
PURGE_EVENTS = (f"DELETE FROM ql_run_event WHERE event_key IN (SELECT e.event_key FROM {_OF_RUN} "
                f"AND r.status IN {ENDED})")
