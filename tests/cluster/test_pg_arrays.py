"""The batched calls' typed arrays (``pg_arrays``): PostgreSQL reads back exactly what was sent (NULLs,
empty arrays, the ends of each integer range, text that needs quoting in the text form), a value of
another type is psycopg's DataError without its value, and a round's statement gets them from a
``ControlDB`` connection."""

from __future__ import annotations

import pytest

from ql_plugins.cluster_fenced import pg_arrays
from ql_plugins.cluster_fenced.pg_arrays import BigintArray, BooleanArray, IntegerArray, TextArray, array_columns

pytestmark = pytest.mark.postgres

_VALUES = [
    (TextArray(["a", None, 'é"{},\\ NULL x', "", "NULL"]), "text[]"),
    (BigintArray([1, None, -2**63, 2**63 - 1, 0]), "bigint[]"),
    (IntegerArray([0, -1, None, 2**31 - 1, -2**31]), "integer[]"),
    (BooleanArray([True, False, None]), "boolean[]"),
    (TextArray([]), "text[]"),
    (BigintArray([]), "bigint[]"),
    (BigintArray([None]), "bigint[]"),
]


def _connect(dsn: str):  # type: ignore[no-untyped-def]
    import psycopg

    conn = psycopg.connect(dsn, autocommit=True)
    pg_arrays.register(conn)
    return conn


def test_postgres_reads_back_exactly_what_was_sent(cluster_dsn: str) -> None:
    with _connect(cluster_dsn) as conn:
        sql = "SELECT " + ", ".join(f"%b::{cast}" for _, cast in _VALUES)
        for prepare in (False, True, True):  # the prepared statement too (same parameter types each time)
            row = conn.execute(sql, [v for v, _ in _VALUES], prepare=prepare).fetchone()
            assert row is not None and list(row) == [list(v) for v, _ in _VALUES]
        # Element by element as PostgreSQL sees them (not only as psycopg parses them back).
        assert conn.execute("SELECT array_length(%b::text[], 1), (%b::text[])[2] IS NULL, cardinality(%b::text[])",
                            [TextArray(["x", None]), TextArray(["x", None]), TextArray([])]).fetchone() == (2, True, 0)


@pytest.mark.parametrize("value", [BigintArray(["1"]), BigintArray([True]), BigintArray([2**63]),
                                   IntegerArray([2**31]), TextArray([1]), BooleanArray([1])])
def test_an_element_of_another_type_is_a_data_error_without_its_value(cluster_dsn: str, value: list) -> None:
    import psycopg

    with _connect(cluster_dsn) as conn:
        with pytest.raises(psycopg.DataError) as raised:
            conn.execute("SELECT %b", [value])
        assert repr(value[0]) not in str(raised.value)


def test_columns_are_typed_per_argument_and_checked() -> None:
    cols = array_columns([("a", 1), ("b", None)], (TextArray, BigintArray))
    assert [type(c) for c in cols] == [TextArray, BigintArray] and cols == [["a", "b"], [1, None]]
    assert array_columns([], (TextArray, BigintArray)) == [[], []]
    with pytest.raises(ValueError):
        array_columns([("a", 1)], (TextArray,))


def test_without_the_dumpers_they_are_plain_lists_to_psycopg(cluster_dsn: str) -> None:
    import psycopg

    with psycopg.connect(cluster_dsn, autocommit=True) as conn:  # no register(): psycopg's list dumper
        assert conn.execute("SELECT %b::bigint[], %b::text[]", [BigintArray([1, None]), TextArray(["x"])]
                            ).fetchone() == ([1, None], ["x"])
