#!/bin/sh
# Start a control node and two workers on this machine, against the local PostgreSQL.
#   examples/cluster/up.sh              start what is not running (safe to run again at any time)
#   examples/cluster/up.sh worker-a     start only that one (control, worker-a, worker-b)
#   examples/cluster/restart.sh worker-a    stop one and start it again
#   examples/cluster/down.sh            stop everything up.sh started
# Creates the database and the worker role if they are missing (QL_ADMIN_URL: a database to connect
# to for that), a task-spec key, the schema, and the grant. A role whose pid file names a live
# `ql` process of this example is left alone: never a second `ql control`, never a log truncated
# (each role's log is appended to), never a pid file overwritten while its process lives.
# QL_EXAMPLE_DB / QL_EXAMPLE_ROLE: another database / worker role name (default ql_example /
# ql_example_worker), e.g. for a throwaway copy.
set -eu
cd "$(dirname "$0")"
here=$PWD
admin=${QL_ADMIN_URL:-postgresql://postgres@127.0.0.1:5432/postgres}
db=${QL_EXAMPLE_DB:-ql_example}
wrole=${QL_EXAMPLE_ROLE:-ql_example_worker}
roles=${*:-control worker-a worker-b}
. ./lib.sh   # check_roles, lock_run, running
check_roles $roles
mkdir -p -m 700 .run
lock_run

python3 - "$admin" "$db" "$wrole" <<'PY'
import sys, psycopg
from psycopg import sql
admin, db, role = sys.argv[1:]
with psycopg.connect(admin, autocommit=True) as conn:
    if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db,)).fetchone():
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db)))
    # The workers' least-privilege role (an example password: use your own, and a ~/.pgpass file).
    if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'example-only-password'").format(sql.Identifier(role)))
PY
# One task-spec key, shared by the control node (seals) and the workers (open); 0600, never replaced.
[ -f .run/spec.key ] || ql db new-spec-key "$here/.run/spec.key"
# Each node's config: the checked-in file with absolute paths, the database and role names, plus the
# key's path. Written to a temporary file and renamed: a running node never reads half a file.
for role in control worker-a worker-b; do
  { sed -e "s|^data_dir = \"\\.run/|data_dir = \"$here/.run/|" \
        -e "s|/ql_example\"|/$db\"|" -e "s|//ql_example_worker:|//$wrole:|" "$role.toml"
    printf 'spec_key_file = "%s"\n' "$here/.run/spec.key"; } >".run/$role.toml.tmp"
  mv -f ".run/$role.toml.tmp" ".run/$role.toml"
done
# The schema, then the grant (both as the admin: the control node's database_url; both idempotent).
# Workers connect as the worker role, which may only call the fenced worker functions.
ql --config .run/control.toml db upgrade
ql --config .run/control.toml db grant-worker "$wrole"
for role in $roles; do
  if running "$role"; then
    echo "$role already running (pid $(cat ".run/$role.pid"))"
    continue
  fi
  case $role in control) cmd=control ;; *) cmd=worker ;; esac
  # Its own session and process group (setsid), so down.sh stops exactly it; the log is appended to.
  QL_LOG_LEVEL=info setsid ql --config "$here/.run/$role.toml" "$cmd" </dev/null >>".run/$role.log" 2>&1 9>&- &
  echo $! >".run/$role.pid.tmp"
  mv -f ".run/$role.pid.tmp" ".run/$role.pid"
  echo "started $role (pid $!, log examples/cluster/.run/$role.log)"
done
