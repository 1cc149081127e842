#!/bin/sh
# Start a control node and two workers on this machine, against the local PostgreSQL.
#   examples/cluster/up.sh            (stop them with examples/cluster/down.sh)
# Creates the database ql_example and the worker role ql_example_worker if they are missing
# (QL_ADMIN_URL: a database to connect to for that), a task-spec key, the schema, and the grant.
set -eu
cd "$(dirname "$0")"
admin=${QL_ADMIN_URL:-postgresql://postgres@127.0.0.1:5432/postgres}
python3 - "$admin" <<'PY'
import sys, psycopg
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    if not conn.execute("SELECT 1 FROM pg_database WHERE datname = 'ql_example'").fetchone():
        conn.execute('CREATE DATABASE "ql_example"')
    # The workers' least-privilege role (an example password: use your own, and a ~/.pgpass file).
    if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = 'ql_example_worker'").fetchone():
        conn.execute("CREATE ROLE ql_example_worker LOGIN PASSWORD 'example-only-password'")
PY
mkdir -p -m 700 .run
# One task-spec key, shared by the control node (seals) and the workers (open); 0600, never replaced.
[ -f .run/spec.key ] || ql db new-spec-key "$PWD/.run/spec.key"
# Each node's config: the checked-in file with absolute paths, plus the key's path.
for role in control worker-a worker-b; do
  { sed "s|^data_dir = \"\\.run/|data_dir = \"$PWD/.run/|" "$role.toml"
    printf 'spec_key_file = "%s"\n' "$PWD/.run/spec.key"; } >".run/$role.toml"
done
# The schema, then the grant (both as the admin: the control node's database_url). Workers connect
# as ql_example_worker, which may only call the fenced worker functions.
ql --config .run/control.toml db upgrade
ql --config .run/control.toml db grant-worker ql_example_worker
for role in control worker-a worker-b; do
  case $role in control) cmd=control ;; *) cmd=worker ;; esac
  QL_LOG_LEVEL=info setsid nohup ql --config ".run/$role.toml" "$cmd" </dev/null >".run/$role.log" 2>&1 &
  echo $! >".run/$role.pid"
  echo "started $role (pid $!, log examples/cluster/.run/$role.log)"
done
