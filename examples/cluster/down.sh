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
[ -d .run ] || exit 0
exec 9>>.run/lock
if command -v flock >/dev/null 2>&1; then   # util-linux; without it, run one at a time yourself
  flock -w 60 9 || { echo "down.sh: another up.sh or down.sh holds $here/.run/lock" >&2; exit 1; }
fi
# args_of PID: its command line, one line (Linux: /proc; elsewhere ps, at full width).
args_of() {
  if [ -r "/proc/$1/cmdline" ]; then tr '\0' ' ' <"/proc/$1/cmdline"; else ps -ww -o args= -p "$1"; fi 2>/dev/null
}
# ours ROLE: the pid in its pid file leads a group that still has a process: this example's `ql`
# for that role, or what is left of its group (a process group id is not reused while the group
# lives, so a group named by our pid file is ours).
ours() {
  pid=$(cat ".run/$1.pid" 2>/dev/null) || return 1
  case $pid in ''|*[!0-9]*) return 1 ;; esac
  if kill -0 "$pid" 2>/dev/null; then
    args_of "$pid" | grep -q -F -- "--config $here/.run/$1.toml"
  else
    ! gone "$pid"
  fi
}
# gone PGID: no process is left in the group (the session up.sh gave the role).
gone() { ! kill -0 "-$1" 2>/dev/null; }
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
