"""Cluster hardening (issue #14): the least-privilege worker role and sealed task specs.

Real PostgreSQL roles (created per test, dropped after), real `ql worker` / `ql control`
processes, the database's own refusals — nothing mocked.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import uuid
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from ql_core.errors import ConfigError
from ql_core.ids import new_id
from ql_core.paths import log_relative_path
from ql_plugins.cluster_fenced import ControlDB, LeaseAnswer, CompletionAnswer, LeaseFence
from ql_plugins.cluster_fenced.roles import GRANTED_TO_WORKERS, grant_worker
from ql_plugins.cluster_fenced.sealing import (
    SpecUnreadable,
    load_key_file,
    new_key_file,
)
from tests.cluster.log_support import assert_shipped_equals_local
from tests.cluster.support import TEST_RING, Cluster, admin_conninfo, opened, seal
from tests.cluster.worker_support import QL, Harness, wait_for

pytestmark = pytest.mark.postgres

PASSWORD = "pw-" + uuid.uuid4().hex  # never printed by ql: the tests grep every output for it


def _role_dsn(dsn: str, role: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(netloc=f"{role}:{PASSWORD}@{parts.hostname}:{parts.port or 5432}"))


@pytest.fixture
def worker_role(cluster_dsn: str) -> Iterator[str]:
    """A fresh LOGIN role with a password, granted by `ql db grant-worker` (the real command)."""
    role = f"ql_w_{uuid.uuid4().hex[:10]}"
    admin = admin_conninfo(cluster_dsn)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            psycopg.sql.Identifier(role), psycopg.sql.Literal(PASSWORD)))
    try:
        yield role
    finally:
        with psycopg.connect(cluster_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
            conn.execute(psycopg.sql.SQL("DROP OWNED BY {}").format(psycopg.sql.Identifier(role)))
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(psycopg.sql.SQL("DROP ROLE IF EXISTS {}").format(psycopg.sql.Identifier(role)))


def _grant_cli(harness: Harness, role: str) -> subprocess.CompletedProcess[str]:
    return harness.ql("db", "grant-worker", role, timeout=60)


def _grant_cli_at(root: Path, dsn: str, role: str) -> subprocess.CompletedProcess[str]:
    """`ql db grant-worker ROLE` with an admin config of its own (no Harness: no worker runs here)."""
    data = root / "admin-data"
    data.mkdir(mode=0o700, exist_ok=True)
    config = root / "admin.toml"
    config.write_text(f'profile = "cluster-control"\ndata_dir = "{data}"\ndatabase_url = "{dsn}"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    env.update({"QL_CONFIG": str(config), "HOME": str(root)})
    return subprocess.run(QL + ["db", "grant-worker", role], env=env, capture_output=True, text=True, timeout=60)


def _pg_dump(dsn: str) -> bytes:
    pg_dump = shutil.which("pg_dump") or "/usr/lib/postgresql/15/bin/pg_dump"
    return subprocess.run([pg_dump, "--no-owner", dsn], capture_output=True, check=True, timeout=120).stdout


def _contains(blob: bytes, canary: str) -> bool:
    """The canary in clear, or as PostgreSQL prints bytea (hex)."""
    raw = canary.encode()
    return raw in blob or raw.hex().encode() in blob


# -- the role ----------------------------------------------------------------------------------------
def test_the_worker_role_may_call_only_the_fenced_functions(cluster_dsn: str, tmp_path: Path,
                                                            worker_role: str) -> None:
    out = _grant_cli_at(tmp_path, cluster_dsn, worker_role)
    assert out.returncode == 0, out.stderr
    again = _grant_cli_at(tmp_path, cluster_dsn, worker_role)  # idempotent
    assert again.returncode == 0 and again.stdout == out.stdout, again.stderr
    assert PASSWORD not in out.stdout + out.stderr

    admin = Cluster(cluster_dsn)
    role_dsn = _role_dsn(cluster_dsn, worker_role)
    role_db = ControlDB.connect(role_dsn)
    try:
        mine, other = admin.submit(2)
        w1 = admin.worker("w1", db=role_db)
        w2 = admin.worker("w2", db=role_db)
        (claimed,) = admin.claim(w1, 1, db=role_db)
        fence = claimed.fence(w1)
        assert claimed.run_id == mine and opened(claimed)["command"] == ["true"]
        assert role_db.start(fence).answer is LeaseAnswer.OK
        assert role_db.running(fence, started_at_ms=0).answer is LeaseAnswer.OK

        with psycopg.connect(role_dsn, autocommit=True) as conn:
            def refused(statement: str, params: tuple = ()) -> None:
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(statement, params)

            # No table: neither a run's state nor any spec, not even sealed.
            refused("UPDATE ql_run SET status = 'succeeded', exit_code = 0 WHERE id = %s", (mine,))
            refused("SELECT * FROM ql_run_spec WHERE run_id = %s", (other,))
            refused("SELECT * FROM ql_run")
            refused("SELECT token_digest FROM ql_attempt_lease")
            refused("DELETE FROM ql_run_event")
            # No control-side or private function.
            refused("SELECT * FROM ql_sweep(16, 0)")
            refused("SELECT * FROM ql_request_cancel(%s, 'user')", (other,))
            refused("SELECT ql__new_token()")
            refused("SELECT ql__finish(%s, %s, 'succeeded', 0, NULL, 0, 0, false, 'completed', NULL, 0)",
                    (mine, claimed.attempt_id))
            # LISTEN needs no privilege: the worker's wake-ups work as the role.
            conn.execute("LISTEN ql_queue")

        # Another run's spec through a worker function: a foreign or stale fence is answered fenced.
        stale = type(w1)(w1.worker_id, w1.generation, str(uuid.uuid4()))
        res = role_db.claim(stale, max_n=1, free_slots=1, executor="local", attempt_ids=[new_id()],
                            log_ids=[new_id()])
        assert res.answer is LeaseAnswer.FENCED and res.attempts == ()
        assert admin.run(other)["status"] == "queued"

        # Completing w1's attempt with w2's fence (or w1's with a guessed token): fenced, nothing changes.
        before = admin.state(mine)
        foreign = LeaseFence(w2.worker_id, w2.generation, w2.session, fence.attempt_id, fence.lease_generation,
                             fence.lease_token)
        assert admin.complete(foreign, 0, db=role_db).answer is CompletionAnswer.FENCED
        guessed = LeaseFence(w1.worker_id, w1.generation, w1.session, fence.attempt_id, fence.lease_generation,
                             "x" * 64)
        assert admin.complete(guessed, 0, db=role_db).answer is CompletionAnswer.FENCED
        assert admin.state(mine)[1:] == before[1:]
        assert "attempt.completion_fenced" in admin.event_types(mine)
        # The holder's own completion is applied, through the same role.
        assert admin.complete(fence, 0, db=role_db).answer is CompletionAnswer.APPLIED
        assert admin.run(mine)["status"] == "succeeded"

        # Announcing a drain (ql_drain, revision 0008) through the role: only the holder's session
        # marks its row; a replay answers ok again; a stale session is fenced and writes nothing.
        assert role_db.drain(stale) is LeaseAnswer.FENCED
        assert role_db.drain(w2) is LeaseAnswer.OK and role_db.drain(w2) is LeaseAnswer.OK
        with psycopg.connect(cluster_dsn) as conn:
            states = dict(conn.execute("SELECT id, status FROM ql_worker WHERE id IN ('w1', 'w2')").fetchall())
        assert states == {"w1": "active", "w2": "draining"}
    finally:
        role_db.close()
        admin.close()


def test_grant_worker_refuses_roles_it_cannot_make_least_privileged(cluster_dsn: str, worker_role: str) -> None:
    with psycopg.connect(cluster_dsn, autocommit=True) as conn:
        with pytest.raises(ConfigError, match="does not exist"):
            grant_worker(conn, "ql_no_such_role_" + uuid.uuid4().hex[:6])
        with pytest.raises(ConfigError, match="superuser"):
            grant_worker(conn, "postgres")
        with pytest.raises(ConfigError, match="role name"):
            grant_worker(conn, "x; DROP TABLE ql_run")
        done = grant_worker(conn, worker_role)
        assert done["functions"] == sorted(GRANTED_TO_WORKERS)
        # Every granted function runs as its owner with a pinned search_path; PUBLIC executes no ql function.
        rows = conn.execute(r"SELECT p.proname, p.prosecdef, p.proconfig, has_function_privilege('public', p.oid, "
                            r"'EXECUTE') FROM pg_proc p WHERE p.pronamespace = current_schema()::regnamespace "
                            r"AND p.proname LIKE 'ql\_%'").fetchall()
        assert rows and not any(public for *_x, public in rows)
        for name, definer, config, _public in rows:
            if name in GRANTED_TO_WORKERS:
                assert definer and "search_path=pg_catalog, public, pg_temp" in config, name  # one path (0014)


def test_ql_worker_runs_a_task_to_its_end_connected_as_the_worker_role(harness: Harness, worker_role: str) -> None:
    harness.start_control()
    worker = harness.start_worker("a", database_url=_role_dsn(harness.dsn, worker_role))
    # Started before the grant: it waits, saying what the admin must run, and never registers.
    wait_for(lambda: "grant-worker" in worker.log.read_text(), what="the worker to ask for the grant",
             diagnose=harness.logs)
    assert worker.alive()
    assert harness.sql.execute("SELECT count(*) AS n FROM ql_worker").fetchone()["n"] == 0
    assert _grant_cli(harness, worker_role).returncode == 0
    ok = harness.submit(["sh", "-c", "seq 1 20000; exit 0"])
    failing = harness.submit(["sh", "-c", "exit 3"], retries=1)
    assert harness.wait_status(ok)["status"] == "succeeded"
    row = harness.wait_status(failing)
    assert (row["status"], row["exit_code"]) == ("failed", 3)
    # Its log was shipped and finalized through the fenced artifact functions alone (the
    # read-back that checks the whole-file SHA-256 included): the same bytes as the local file.
    (attempt,) = harness.attempts(ok)
    shipped = assert_shipped_equals_local(harness, "a", attempt["id"])
    assert shipped == "".join(f"{i}\n" for i in range(1, 20001)).encode()
    # Reading logs is not a worker's right: `ql logs` with the worker's own config (the role) is
    # one line naming the fix, never a traceback; the control node's config reads them.
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    env.update({"QL_CONFIG": str(harness.root / "a.toml"), "HOME": str(harness.root)})
    denied = subprocess.run(QL + ["logs", ok], env=env, capture_output=True, text=True, timeout=60)
    assert denied.returncode == 1 and "Traceback" not in denied.stderr, denied.stderr
    assert "may not read shipped logs" in denied.stderr and "control node" in denied.stderr
    assert PASSWORD not in denied.stderr
    assert harness.ql("logs", ok).stdout.encode() == shipped
    # It really was the role: its sessions are the role's.
    users = {r["usename"] for r in harness.sql.execute(
        "SELECT usename FROM pg_stat_activity WHERE application_name LIKE 'ql-%%'").fetchall()}
    assert worker_role in users
    worker.signal(15)
    assert worker.wait(30) == 0, harness.logs()
    # Its drain was announced through ql_drain (revision 0008), which the grant includes.
    assert "could not mark this worker draining" not in worker.log.read_text(errors="replace"), harness.logs()
    assert PASSWORD not in harness.logs()
    assert harness.sql.execute("SELECT count(*) AS n FROM ql_run_spec").fetchone()["n"] == 0


def test_a_worker_role_without_ql_drain_drains_all_the_same(harness: Harness, worker_role: str) -> None:
    """A role granted before revision 0008 (no EXECUTE on ql_drain): the announcement is refused by
    PostgreSQL, the worker says what to run and drains and deregisters as always."""
    assert _grant_cli(harness, worker_role).returncode == 0
    with psycopg.connect(harness.dsn, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("REVOKE EXECUTE ON FUNCTION ql_drain(text, bigint, text) FROM {}").format(
            psycopg.sql.Identifier(worker_role)))
    worker = harness.start_worker("a", database_url=_role_dsn(harness.dsn, worker_role))
    wait_for(lambda: harness.sql.execute("SELECT status FROM ql_worker WHERE id = 'a'").fetchone(),
             what="the worker to register", diagnose=harness.logs)
    worker.signal(15)
    assert worker.wait(30) == 0, harness.logs()
    log = worker.log.read_text(errors="replace")
    assert "could not mark this worker draining" in log and "grant-worker" in log, log
    row = harness.sql.execute("SELECT status FROM ql_worker WHERE id = 'a'").fetchone()
    assert row["status"] == "stopped" and PASSWORD not in log and "Traceback" not in log


# -- sealed specs ------------------------------------------------------------------------------------
def test_a_canary_in_argv_and_env_never_reaches_the_database_the_data_dir_or_a_log(
        harness: Harness, worker_role: str) -> None:
    canary = "ql-canary-" + uuid.uuid4().hex
    assert _grant_cli(harness, worker_role).returncode == 0
    run_id = harness.submit(["sh", "-c", f'test "$QL_CANARY" = "{canary}"'], retries=2,
                            env={"QL_CANARY": canary, "PATH": os.environ["PATH"]})
    # Queued: sealed only (three copies, one per allowed attempt).
    queued = _pg_dump(harness.dsn)
    assert not _contains(queued, canary)
    copies = harness.sql.execute("SELECT ordinal FROM ql_run_spec WHERE run_id = %s ORDER BY ordinal",
                                 (run_id,)).fetchall()
    assert [c["ordinal"] for c in copies] == [1, 2, 3]

    harness.start_control()
    harness.start_worker("a", database_url=_role_dsn(harness.dsn, worker_role))
    row = harness.wait_status(run_id)
    assert (row["status"], row["exit_code"]) == ("succeeded", 0)  # the worker opened the real spec
    wait_for(lambda: all(r["state"] == "answered" for r in harness.lease_rows("a")) and harness.lease_rows("a"),
             what="the final answer recorded locally", diagnose=harness.logs)
    harness.stop_all()

    ended = _pg_dump(harness.dsn)
    assert not _contains(ended, canary)
    assert harness.sql.execute("SELECT count(*) AS n FROM ql_run_spec").fetchone()["n"] == 0  # all erased
    (attempt,) = harness.attempts(run_id)
    task_log = harness.worker_dir("a") / log_relative_path(attempt["log_artifact_id"])
    seen = []
    for path in sorted(Path(harness.root).rglob("*")):
        if not path.is_file() or path == task_log or path.name.endswith(".toml"):
            continue
        if _contains(path.read_bytes(), canary):
            seen.append(path)
    assert seen == [], f"the canary is in {seen}"
    assert not _contains(harness.logs().encode(), canary)


def test_a_copy_moved_to_another_run_fails_authentication_and_the_attempt_ends_clearly(harness: Harness) -> None:
    victim = harness.submit(["sh", "-c", "exit 0"])
    donor = harness.submit(["sh", "-c", "exit 7"])
    # An attacker with write access to the table swaps the sealed copies.
    harness.sql.execute("UPDATE ql_run_spec SET sealed = (SELECT sealed FROM ql_run_spec WHERE run_id = %s) "
                        "WHERE run_id = %s", (donor, victim))
    harness.sql.execute("DELETE FROM ql_run_spec WHERE run_id = %s", (donor,))
    harness.sql.execute("SELECT ql_request_cancel(%s, 'user')", (donor,))
    harness.start_worker("a")
    row = harness.wait_status(victim)
    assert (row["status"], row["reason"]) == ("lost", "SPEC_UNREADABLE")  # never ran the donor's command
    (attempt,) = harness.attempts(victim)
    assert attempt["started_at_ms"] is None or attempt["exit_code"] is None
    assert "cannot be opened" in harness.logs()


def test_copies_are_bound_to_run_and_ordinal_and_erased_as_attempts_end(cluster: Cluster) -> None:
    (run_id,) = cluster.submit(max_attempts=2, spec={"command": ["echo", "x"], "env": {"K": "v"}})
    w = cluster.worker()

    def ordinals() -> list[int]:
        return [r["ordinal"] for r in cluster.sql.execute(
            "SELECT ordinal FROM ql_run_spec WHERE run_id = %s ORDER BY ordinal", (run_id,)).fetchall()]

    # A claim that expired before it started: no retry used, copy 1 stays for the next attempt.
    (first,) = cluster.claim(w)
    assert first.sealed_spec.ordinal == 1
    cluster.expire(first.attempt_id)
    assert cluster.db.sweep().requeued == 1
    assert ordinals() == [1, 2]
    # Started, then lost: copy 1 is erased with it; the retry gets copy 2, bound to ordinal 2.
    claimed, fence = cluster.running_attempt(w)
    assert claimed.sealed_spec.ordinal == 1 and opened(claimed)["env"] == {"K": "v"}
    cluster.expire(fence.attempt_id)
    assert cluster.db.sweep().retried == 1
    assert ordinals() == [2]
    (retry,) = cluster.claim(w)
    assert retry.sealed_spec.ordinal == 2 and opened(retry)["command"] == ["echo", "x"]
    moved = type(retry.sealed_spec)(retry.sealed_spec.key_id, 1, retry.sealed_spec.blob)
    with pytest.raises(SpecUnreadable, match="fails authentication"):
        TEST_RING.open(run_id, moved)  # copy 2 presented as ordinal 1
    with pytest.raises(SpecUnreadable, match="fails authentication"):
        TEST_RING.open(new_id(), retry.sealed_spec)  # or as another run's
    fence = retry.fence(w)
    assert cluster.db.start(fence).answer is LeaseAnswer.OK
    assert cluster.db.running(fence, started_at_ms=0).answer is LeaseAnswer.OK
    assert cluster.complete(fence, 0).answer is CompletionAnswer.APPLIED
    assert ordinals() == []
    # A queued run cancelled: its copies go with it.
    (queued,) = cluster.submit(max_attempts=3)
    cluster.db.request_cancel(queued)
    assert cluster.sql.execute("SELECT count(*) AS n FROM ql_run_spec").fetchone()["n"] == 0


def test_submit_refuses_plaintext_and_malformed_copies(cluster: Cluster) -> None:
    from ql_plugins.cluster_fenced import ControlDBError
    from ql_plugins.cluster_fenced.sealing import SealedSpec

    run_id = new_id()
    good = seal(run_id, max_attempts=2)
    for bad, what in ((SealedSpec(good.key_id, good.copies[:1]), "sealed"),  # fewer copies than attempts
                      (SealedSpec("not-a-key-id", good.copies), "key_id"),
                      (SealedSpec(good.key_id, (b"short", b"short")), "sealed")):
        with pytest.raises(ControlDBError, match=what):
            cluster.db.submit(run_id, sealed=bad, max_attempts=2)
    assert cluster.run(run_id) is None


def test_rotation_the_previous_key_opens_what_it_sealed_and_nothing_else(tmp_path: Path) -> None:
    from ql_plugins.cluster_fenced.sealing import SealedCopy, SpecKeyRing, encode_spec

    old, new = tmp_path / "old.key", tmp_path / "new.key"
    new_key_file(old)
    new_key_file(new)
    run_id = new_id()
    plain = encode_spec(["echo", "rotated"], False, None, {"A": "1"})
    sealed_old = SpecKeyRing.from_settings(str(old), None).seal(run_id, plain, 1)
    sealed_new = SpecKeyRing.from_settings(str(new), None).seal(run_id, plain, 1)
    rotating = SpecKeyRing.from_settings(str(new), str(old))  # a worker during the rotation
    for sealed in (sealed_old, sealed_new):
        copy = SealedCopy(sealed.key_id, 1, sealed.copies[0])
        assert rotating.open(run_id, copy)["command"] == ["echo", "rotated"]
    assert rotating.seal(run_id, plain, 1).key_id == sealed_new.key_id  # seals with the current key only
    after = SpecKeyRing.from_settings(str(new), None)  # the old key removed
    with pytest.raises(SpecUnreadable, match=sealed_old.key_id) as info:
        after.open(run_id, SealedCopy(sealed_old.key_id, 1, sealed_old.copies[0]))
    assert old.read_bytes().hex() not in str(info.value)


# -- key files ----------------------------------------------------------------------------------------
def test_key_files_are_checked_and_errors_name_the_fix(tmp_path: Path) -> None:
    key = tmp_path / "spec.key"
    key_id = new_key_file(key)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and load_key_file(key).key_id == key_id
    with pytest.raises(ConfigError, match="already exists"):
        new_key_file(key)
    key.chmod(0o640)
    with pytest.raises(ConfigError, match="chmod 600"):
        load_key_file(key)
    key.chmod(0o600)
    short = tmp_path / "short.key"
    short.write_bytes(b"x" * 16)
    short.chmod(0o600)
    with pytest.raises(ConfigError, match="exactly 32"):
        load_key_file(short)
    fifo = tmp_path / "fifo.key"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_key_file(fifo)  # opened without blocking: a FIFO cannot hang us
    with pytest.raises(ConfigError, match="new-spec-key"):
        load_key_file(tmp_path / "missing.key")
    key_bytes = key.read_bytes()
    for message in [str(e) for e in _errors(tmp_path)]:
        assert "\n" not in message and key_bytes.hex() not in message


def _errors(tmp_path: Path) -> list[Exception]:
    out: list[Exception] = []
    for name in ("missing.key", "short.key", "fifo.key"):
        try:
            load_key_file(tmp_path / name)
        except ConfigError as exc:
            out.append(exc)
    return out


def test_without_a_key_ql_worker_and_a_cluster_submit_are_one_line_errors(harness: Harness) -> None:
    config = harness.write_config(harness.root / "nokey.toml", profile="cluster-worker",
                                  data_dir=harness.worker_dir("nokey"), plugin={"spec_key_file": None})
    out = harness.ql("worker", env={"QL_CONFIG": str(config)}, timeout=30)
    assert out.returncode == 2 and "spec_key_file" in out.stderr and "new-spec-key" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    control = harness.write_config(harness.root / "nokey-control.toml", profile="cluster-control",
                                   data_dir=harness.root / "control-data", plugin={"spec_key_file": None})
    (harness.root / "control-data").mkdir(mode=0o700, exist_ok=True)
    out = harness.ql("run", "--detach", "--", "true", env={"QL_CONFIG": str(control)}, timeout=30)
    assert out.returncode == 2 and "spec_key_file" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert harness.sql.execute("SELECT count(*) AS n FROM ql_run").fetchone()["n"] == 0


def test_new_spec_key_command_creates_a_private_key(harness: Harness) -> None:
    path = harness.root / "made.key"
    out = subprocess.run(QL + ["db", "new-spec-key", str(path)], capture_output=True, text=True, timeout=30,
                         env={k: v for k, v in os.environ.items() if not k.startswith("QL_")})
    assert out.returncode == 0, out.stderr
    assert load_key_file(path).key_id in out.stdout and stat.S_IMODE(path.stat().st_mode) == 0o600
    again = subprocess.run(QL + ["db", "new-spec-key", str(path)], capture_output=True, text=True, timeout=30)
    assert again.returncode != 0 and "already exists" in again.stderr


# -- the upgrade ------------------------------------------------------------------------------------
def test_upgrading_to_0005_ends_plaintext_queued_runs_clearly_and_keeps_the_rest(postgres_url: str) -> None:
    """A database at 0004 with a plaintext spec queued: the upgrade cannot seal it (no key in the
    database), so that run ends failed SPEC_NOT_SEALED with its event; nothing else changes."""
    from alembic import command
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    from ql_core.db.migrate import SCHEMA_HEAD, alembic_config, upgrade
    from tests.cluster.support import check_invariants, conninfo_of

    name = f"ql_u_{uuid.uuid4().hex[:12]}"
    admin = admin_conninfo(postgres_url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = postgres_url.rsplit("/", 1)[0] + "/" + name
    dsn = conninfo_of(url)
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "0004_cluster_worker")
        queued = new_id()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT * FROM ql_submit(%s, NULL, %s::jsonb, NULL, 1)",
                         (queued, '{"command": ["echo", "clear"], "env": {}}'))
        assert upgrade(engine) == SCHEMA_HEAD
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SELECT status, reason FROM ql_run WHERE id = %s", (queued,)).fetchone()
            assert row == ("failed", "SPEC_NOT_SEALED")
            types = [r[0] for r in conn.execute("SELECT type FROM ql_run_event WHERE run_id = %s ORDER BY seq",
                                                (queued,)).fetchall()]
            assert types == ["run.created", "run.failed"]
            assert conn.execute("SELECT count(*) FROM ql_run_spec").fetchone()[0] == 0
        check_invariants(dsn)
        assert not _contains(_pg_dump(dsn), "clear\"")
    finally:
        engine.dispose()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
