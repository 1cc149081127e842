#!/bin/sh
# Stop what up.sh started: SIGTERM to each role's process group, then wait until it is gone (each
# worker drains: its running attempts finish, at most drain_timeout_s = 30 s), SIGKILL after that.
#   examples/cluster/down.sh            all roles
#   examples/cluster/down.sh worker-a   only that one
# A pid file whose process is gone (or is not this example's `ql` any more) is only removed.
set -u
cd "$(dirname "$0")"
here=$PWD
roles=${*:-worker-a worker-b control}
. ./lib.sh   # check_roles, lock_run, ours (sets $pid), gone
check_roles $roles
[ -d .run ] || exit 0
lock_run
stopping=""
for role in $roles; do
  if ours "$role"; then
    kill -TERM "-$pid" 2>/dev/null && echo "stopping $role (pid $pid)"
    stopping="$stopping $role:$pid"
  else
    rm -f ".run/$role.pid"
  fi
done
for item in $stopping; do
  role=${item%%:*}; pid=${item#*:}
  i=0
  while ! gone "$pid" && [ $i -lt 400 ]; do sleep 0.1; i=$((i + 1)); done   # 40 s: the drain, and then some
  if ! gone "$pid"; then
    echo "$role did not stop in 40 s: SIGKILL" >&2
    kill -KILL "-$pid" 2>/dev/null
    while ! gone "$pid"; do sleep 0.1; done
  fi
  rm -f ".run/$role.pid"
  echo "stopped $role"
done
