#!/bin/sh
# Start a control node and two workers on this machine, against the local PostgreSQL.
#   examples/cluster/up.sh            (stop them with examples/cluster/down.sh)
# Creates the database ql_example if it is missing (QL_ADMIN_URL: a database to connect to for that).
set -eu
cd "$(dirname "$0")"
admin=${QL_ADMIN_URL:-postgresql://postgres@127.0.0.1:5432/postgres}
python3 - "$admin" <<'PY'
import sys, psycopg
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    if not conn.execute("SELECT 1 FROM pg_database WHERE datname = 'ql_example'").fetchone():
        conn.execute('CREATE DATABASE "ql_example"')
PY
mkdir -p -m 700 .run
for role in control worker-a worker-b; do
  case $role in control) cmd=control ;; *) cmd=worker ;; esac
  QL_LOG_LEVEL=info setsid nohup ql --config "$role.toml" "$cmd" </dev/null >".run/$role.log" 2>&1 &
  echo $! >".run/$role.pid"
  echo "started $role (pid $!, log examples/cluster/.run/$role.log)"
done
