#!/bin/sh
# Stop what up.sh started: SIGTERM, then each worker drains (bounded) and exits.
cd "$(dirname "$0")"
for role in worker-a worker-b control; do
  [ -f ".run/$role.pid" ] || continue
  pid=$(cat ".run/$role.pid")
  kill -TERM "$pid" 2>/dev/null && echo "stopping $role (pid $pid)"
  rm -f ".run/$role.pid"
done
