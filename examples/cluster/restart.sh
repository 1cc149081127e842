#!/bin/sh
# Stop one role (or several) and start it again:  examples/cluster/restart.sh worker-a
# The worker drains first (its running attempts finish, at most 30 s); see README, "Restarting a worker".
set -eu
[ $# -gt 0 ] || { echo "usage: restart.sh ROLE... (control, worker-a, worker-b)" >&2; exit 2; }
. "$(dirname "$0")/lib.sh"   # check_roles: refused before anything is stopped
check_roles "$@"
"$(dirname "$0")/down.sh" "$@"
"$(dirname "$0")/up.sh" "$@"
