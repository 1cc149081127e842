# Sourced by up.sh, down.sh and restart.sh: what they share, written once. up.sh and down.sh source it
# after `cd` into this folder, with here=$PWD.
#   check_roles ROLE...   exit 2 naming a role this example does not have
#   lock_run              one up.sh or down.sh at a time (.run/lock, held on fd 9)
#   running ROLE          its pid file names a live `ql` of this example for that role ($pid: that pid)
#   ours ROLE             running, or its `ql` is gone and its process group still has a process
#   gone PGID             no process is left in the group
me=${0##*/}

check_roles() {
  for role in "$@"; do
    case $role in
      control|worker-a|worker-b) ;;
      *) echo "$me: unknown role '$role' (control, worker-a, worker-b)" >&2; exit 2 ;;
    esac
  done
}

# Two at once could both find a role stopped and both start it.
lock_run() {
  exec 9>>.run/lock
  if command -v flock >/dev/null 2>&1; then   # util-linux; without it, run one at a time yourself
    flock -w 60 9 || { echo "$me: another up.sh or down.sh holds $here/.run/lock" >&2; exit 1; }
  fi
}

# args_of PID: its command line, one line (Linux: /proc; elsewhere ps, at full width).
args_of() {
  if [ -r "/proc/$1/cmdline" ]; then tr '\0' ' ' <"/proc/$1/cmdline"; else ps -ww -o args= -p "$1"; fi 2>/dev/null
}

# The command line, not the pid alone: a pid file can outlive its process, and the pid be reused.
running() {
  pid=$(cat ".run/$1.pid" 2>/dev/null) || return 1
  case $pid in ''|*[!0-9]*) return 1 ;; esac
  args_of "$pid" | grep -q -F -- "--config $here/.run/$1.toml"
}

# What is left of a role's group is ours too (a task its killed worker left): a process group id is
# not reused while the group lives, so a group named by our pid file is ours. A live process under
# that pid that is not our `ql` means the pid was reused: not ours.
ours() {
  running "$1" && return 0
  case $pid in ''|*[!0-9]*) return 1 ;; esac
  ! kill -0 "$pid" 2>/dev/null && ! gone "$pid"
}

# (The session up.sh gave the role, whose id is its pid.)
gone() { ! kill -0 "-$1" 2>/dev/null; }
