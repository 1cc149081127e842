# ql POSIX launcher: runs one task command and publishes its completion receipt (ADR-0007 §2.4).
#
#   sh launcher.sh SHARD_DIR RUN_ID ATTEMPT_ID CALLBACK_SEQUENCE STARTED_AT_MS MODE [LIMITS] -- CMD [ARG...]
#
# LIMITS (optional; launcher.c "LIMITS" and docs/launcher.md "Protections"): the word
# START_BOOT_MS,TIMEOUT_MS,GRACE_MS,QUOTA_BYTES,ACK_WAIT_MS, each a canonical integer or empty.
# This launcher enforces them with helper processes in its own group: a deadline watchdog (TERM to
# the group at START_BOOT_MS + TIMEOUT_MS on the boot clock, /proc/uptime; KILL to the group but
# the launcher GRACE_MS later), a KILL GRACE_MS after a forwarded TERM (async mode only: in
# foreground mode the shell runs no trap while CMD runs), and a quota watcher that checks the log's
# size once a second while CMD runs (stat and truncate on PATH; a wake-up a second, as the shell
# has no inotify).
#
# MODE argv: run CMD ARG... as given; MODE shell: exactly one word after --, run as /bin/sh -c WORD.
# MODE may carry flags after a '+', each one letter (docs/launcher.md, "The acknowledged path"):
#   c  the token channel arrives on stdin: the launcher moves it to fd 3 itself (no trampoline);
#   e  the host found GNU `env --default-signal` on this PATH: no probe per task (async mode);
#   p  the host found printf to be this shell's builtin: no check per publication;
#   a  acknowledged completion: the channel (a socket) stays open after the token. When CMD has
#      ended, the launcher leaves a publisher behind and exits with CMD's status at once; the
#      host reaps that status (the kernel's word, not ours), commits it and sends "ok" on the
#      channel. The publisher publishes the receipt only if no "ok" comes (EOF: the host died or
#      gave up before its commit was durable).
# fd 3: an inherited pipe (or socket) carrying the callback token as one line; read and closed before CMD
# starts. The line is the go-ahead too: CMD starts only once a valid token arrives (the host writes
# it after committing the launcher's handle); EOF or an invalid line ends the launcher with 125 and
# CMD never runs. stdin is /dev/null, stdout/stderr are the task log: the launcher prints nothing.
# Exit status: CMD's (128+N when CMD died of signal N), whether or not a receipt could be published;
# 125 and no receipt when the arguments break this contract or no token came (nothing is run), or
# when the shell could not tell CMD's status (see the wait loop).
#
# Portable to dash, bash and busybox ash. Every variable is prefixed _ql_ and unset first: a
# variable inherited from the environment stays exported, so reusing its name would leak our value
# into CMD's environment (fatal for the token). The whole body is one brace group: the shell parses
# all of it before running any of it, so a launcher.sh replaced on disk cannot confuse a live task.
{
# Containment (docs/launcher.md): the host names the parent cgroup in _ql_cgroup; CMD runs in
# PARENT/ATTEMPT_ID. Read before the unset below, and kept unexported (unset, then assigned).
unset _ql_cg
_ql_cg=${_ql_cgroup-}
unset _ql_cgroup
unset _ql_sigs _ql_h _ql_h3 _ql_h4 _ql_uuid7 _ql_ok _ql_shard _ql_run _ql_attempt _ql_seq \
	_ql_started _ql_mode _ql_child _ql_pending _ql_sig _ql_tok _ql_pipe _ql_x _ql_t0 _ql_reset \
	_ql_pid _ql_s _ql_nap _ql_spins _ql_w _ql_status _ql_fin _ql_t _ql_us _ql_final _ql_tmp _ql_f \
	_ql_mine _ql_flags _ql_await _ql_ack _ql_limits _ql_lstart _ql_ltimeout _ql_lgrace _ql_lquota \
	_ql_lack _ql_u _ql_dogs _ql_killer _ql_l _ql_p _ql_found _ql_n _ql_spare _ql_r _ql_ms _ql_termed _ql_last
# Signals we forward; the command starts with default dispositions for them (see the two modes).
_ql_sigs=HUP,INT,QUIT,TERM,USR1,USR2

# Character classes are spelled out: ranges like [a-f] depend on the locale in some shells.
_ql_h='[0123456789abcdef]'
_ql_h4=$_ql_h$_ql_h$_ql_h$_ql_h
_ql_h3=$_ql_h$_ql_h$_ql_h
_ql_uuid7="$_ql_h4$_ql_h4-$_ql_h4-7$_ql_h3-[89ab]$_ql_h3-$_ql_h4$_ql_h4$_ql_h4"
# A canonical JSON integer the receipt codec accepts: 0 .. 2^53-1 (exact in any JSON reader).
_ql_uint() {
	case $1 in '' | *[!0123456789]* | 0?*) return 1 ;; esac
	[ "${#1}" -le 16 ] && [ "$1" -le 9007199254740991 ]
}

# One LIMITS field: empty (none) or a canonical integer.
_ql_limit() {
	[ -z "$1" ] || _ql_uint "$1"
}

_ql_ok= _ql_limits= _ql_lstart= _ql_ltimeout= _ql_lgrace= _ql_lquota= _ql_lack=30000 _ql_n=
# "--" right after MODE: no LIMITS (a LIMITS word is never "--"); else LIMITS, then "--".
if [ "$#" -ge 8 ] && [ "$7" = "--" ]; then
	_ql_n=7
elif [ "$#" -ge 9 ] && [ "$8" = "--" ]; then
	_ql_n=8 _ql_limits=$7
fi
if [ -n "$_ql_n" ]; then
	_ql_shard=$1 _ql_run=$2 _ql_attempt=$3 _ql_seq=$4 _ql_started=$5 _ql_mode=$6 _ql_flags=
	shift "$_ql_n"
	_ql_ok=1
	if [ "$_ql_n" = 8 ]; then
		# LIMITS: exactly five comma-separated fields (four commas), each empty or an integer.
		case $_ql_limits in *,*,*,*,*,*) _ql_ok= ;; *,*,*,*,*) ;; *) _ql_ok= ;; esac
		_ql_lstart=${_ql_limits%%,*} _ql_limits=${_ql_limits#*,}
		_ql_ltimeout=${_ql_limits%%,*} _ql_limits=${_ql_limits#*,}
		_ql_lgrace=${_ql_limits%%,*} _ql_limits=${_ql_limits#*,}
		_ql_lquota=${_ql_limits%%,*} _ql_limits=${_ql_limits#*,}
		[ -n "$_ql_limits" ] && _ql_lack=$_ql_limits
		for _ql_x in "$_ql_lstart" "$_ql_ltimeout" "$_ql_lgrace" "$_ql_lquota" "$_ql_lack"; do
			_ql_limit "$_ql_x" || _ql_ok=
		done
	fi
	case $_ql_shard in /*) ;; *) _ql_ok= ;; esac
	case $_ql_mode in *+*) _ql_flags=${_ql_mode#*+} _ql_mode=${_ql_mode%%+*} ;; esac
	case $_ql_flags in *[!cepa]*) _ql_ok= ;; esac
	case $_ql_run in $_ql_uuid7) ;; *) _ql_ok= ;; esac
	case $_ql_attempt in $_ql_uuid7) ;; *) _ql_ok= ;; esac
	_ql_uint "$_ql_seq" && [ "$_ql_seq" -ge 1 ] && _ql_uint "$_ql_started" || _ql_ok=
	case $_ql_mode in
	argv) ;;
	shell) if [ "$#" -eq 1 ]; then set -- /bin/sh -c "$1"; else _ql_ok=; fi ;;
	*) _ql_ok= ;;
	esac
fi
[ -n "$_ql_ok" ] || exit 125
case $_ql_cg in /*) _ql_cg=$_ql_cg/$_ql_attempt ;; *) _ql_cg= ;; esac
# The channel on stdin becomes fd 3, where the token is read; stdin becomes /dev/null.
case $_ql_flags in *c*) exec 3<&0 0</dev/null ;; esac
# bash in POSIX mode (e.g. as /bin/sh) forgets a child's status once `wait` reported it; the wait
# loop below relies on asking twice. `command` keeps other shells alive when they reject the option.
command set +o posix 2>/dev/null

# Signals may arrive before the child exists; they are remembered and forwarded once it does.
_ql_child= _ql_pending= _ql_sig= _ql_termed=
_ql_on_signal() {
	_ql_sig=1
	if [ -n "$_ql_child" ]; then
		kill -s "$1" "$_ql_child" 2>/dev/null
		# What `ql cancel` sends: the group gets KILL GRACE_MS later if CMD is still there. The
		# killer is started by the wait loop, not here: a job started while CMD's job is done and
		# already waited for makes dash free CMD's job, and its status would be lost.
		[ "$1" = TERM ] && _ql_termed=1
	else
		_ql_pending="$_ql_pending $1"
	fi
}
trap '_ql_on_signal HUP' HUP
trap '_ql_on_signal INT' INT
trap '_ql_on_signal QUIT' QUIT
trap '_ql_on_signal TERM' TERM
trap '_ql_on_signal USR1' USR1
trap '_ql_on_signal USR2' USR2

# How CMD gets default dispositions for every signal we forward. A non-interactive shell starts
# an asynchronous (`&`) command with SIGINT and SIGQUIT ignored; dash and busybox ash then refuse
# `trap - INT QUIT` in that subshell (bash resets INT, not QUIT), and an ignored disposition
# survives exec. So the launcher probes once for GNU env (coreutils >= 8.31), which resets them,
# and picks one of two modes (docs/launcher.md has the reasoning and the tests behind it):
#
# - async (GNU env found): CMD starts with `&` through `env --default-signal`, and the launcher
#   waits in the `wait` builtin, where traps run: a signal sent to the launcher's pid alone is
#   forwarded. Left open: from the fork until env has reset them (about one exec), an INT or QUIT
#   sent to the group is ignored by the child (TERM, HUP, USR1, USR2 are not affected).
# - foreground (no GNU env: busybox-only systems): CMD is a foreground child. A shell resets its
#   trapped signals to the default in every child it forks and only `&` adds the INT/QUIT ignore,
#   so CMD starts with defaults and no helper is needed. The price: a shell runs no trap while a
#   foreground child runs, so a signal sent to the launcher's pid ALONE is held until CMD ends and
#   never forwarded; a signal sent to the process GROUP (what ql always does) reaches CMD straight
#   from the kernel. A signal the launcher itself inherited as ignored (nohup) stays ignored.
#
# In both modes a signal caught before CMD was forked is in _ql_pending, and the child's copy of it
# decides: instead of running CMD, the child re-delivers the first one to itself, its dispositions
# already at default, so an early INT ends the task as 130 instead of being ignored. Still open in
# foreground mode: a group signal that lands while the launcher forks (from the shell's last trap
# check until the child has reset its handlers; dash and busybox ash do not block signals across
# fork, about 0.1 ms here) is caught by the launcher and dropped by the child - for every trapped
# signal, TERM included. ql's cancellation escalates to KILL, which nothing can catch.
# The probe must not see the token pipe (fd 3).
_ql_reset=
case $_ql_flags in
*e*) _ql_reset=1 ;;
*) env -i "--default-signal=$_ql_sigs" >/dev/null 2>&1 3<&- && _ql_reset=1 ;;
esac

# The token is never exported (see above), never in any argv and never printed to fd 1/2.
# 2>/dev/null comes first so a closed fd 3 cannot put an error message into the log.
_ql_tok=
IFS= read -r _ql_tok 2>/dev/null <&3 || _ql_tok=
# bash in async mode only (see the wait loop): reopen the now empty token pipe read-write as a
# private pipe that never has data nor EOF, so `read -t` on it is a sleep during which traps still
# run. Kept only if a byte written to it can be read back (a /dev/fd that merely dups would give an
# EOF spin). ($BASHPID equal to $$ tells bash itself from a BASH_VERSION merely inherited.)
# With an acknowledged channel (a socket: /dev/fd cannot reopen it), bash sleeps on the channel
# itself: the host writes nothing more there before CMD's status reached it, so only EOF (the host
# died) ends such a sleep early, and then the loop falls back to `wait`. It stays open as fd 5.
_ql_pipe= _ql_await=
case $_ql_flags in *a*) exec 5<&3 && _ql_await=1 ;; esac
if [ -n "$_ql_reset" ] && [ -n "${BASH_VERSION-}" ] && [ "${BASHPID-}" = "$$" ]; then
	if [ -n "$_ql_await" ]; then
		_ql_pipe=5
	elif { exec 4<>/dev/fd/3; } 2>/dev/null; then
		{ printf x >&4 && read -r -t 1 -n 1 -u 4 _ql_x && [ "$_ql_x" = x ]; } 2>/dev/null && _ql_pipe=4
		[ -n "$_ql_pipe" ] || exec 4<&-
	fi
fi
exec 3<&-
# The token is also the go-ahead: the host writes it only after it has committed this launcher's
# durable handle, so a host that dies before that commit closes the pipe and CMD never runs (EOF or
# an invalid line: exit 125, nothing run, no receipt). That is what lets recovery prove "never
# started" from a dead host and a missing handle instead of guessing with a timer.
case $_ql_tok in
*[!ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-]*) exit 125 ;;
esac
[ "${#_ql_tok}" -ge 32 ] && [ "${#_ql_tok}" -le 128 ] || exit 125

# bash and busybox ash provide $EPOCHREALTIME; a variable of that name merely inherited from the
# environment would not move, so it is trusted only if it differs from this start value.
_ql_t0=${EPOCHREALTIME-}

# --- Protections (LIMITS): helpers in the launcher's group, ended when CMD has ended. ---
# The boot clock in ms into _ql_ms: /proc/uptime is CLOCK_BOOTTIME (counts suspend, never steps),
# in 1/100 s (rounded down here). Fails without it.
_ql_boot_ms() {
	_ql_ms=
	{ read -r _ql_u _ql_x </proc/uptime; } 2>/dev/null || return 1
	case $_ql_u in *[!0123456789.]* | .*) return 1 ;; *.??) ;; *) return 1 ;; esac
	_ql_ms=$((${_ql_u%.*} * 1000 + 1${_ql_u#*.} * 10 - 1000))
}
# Sleep $1 ms: fractional seconds where sleep takes them (GNU, busybox), else rounded up (late,
# never early).
_ql_sleep_ms() {
	sleep "$(($1 / 1000)).$(printf %03d "$(($1 % 1000))")" 2>/dev/null || sleep "$((($1 + 999) / 1000))"
}
# State, parent and group of a /proc/PID/stat line's tail (after the command name's ")").
_ql_stat_of() {
	set -f
	# shellcheck disable=SC2086
	set -- $1
	set +f
	_ql_x=$1 _ql_p=$2 _ql_u=$3
}
# The pid of the calling subshell ($$ is the launcher's in every subshell) into _ql_spare.
_ql_self() {
	_ql_spare=$(exec /bin/sh -c 'echo "$PPID"')
}
# KILL for every running member of the launcher's group but the launcher, the caller (_ql_spare),
# the other helpers started before it (_ql_dogs) and their children (a sleep), scanned in /proc
# until none is left (at most 64 scans): the launcher must live on to publish the receipt, and a
# group KILL would take it too. CMD is stopped first and killed last, and each scan stops what it
# finds before it kills any of it: nothing sees another die and goes on (a `sh -c '...; exit 0'`
# whose child was killed would end 0), and once CMD is gone the launcher ends its helpers, this
# one too. A launcher that does not lead its group (not started by ql) kills CMD alone.
# In foreground mode the helpers started before CMD, so they do not know its pid: CMD is the
# member whose parent is the launcher, stopped when found and killed after the last scan too. (It
# was killed with the others of its scan: the launcher, seeing CMD end, could stop this helper
# between two of those KILLs, and a stopped grandchild was left behind for good.)
_ql_kill_group() {
	_ql_cg_kill
	if [ -n "$_ql_child" ]; then kill -s STOP "$_ql_child" 2>/dev/null; fi
	_ql_n=0 _ql_last=
	while [ -n "$_ql_leader" ] && [ "$_ql_n" -lt 64 ]; do
		_ql_n=$((_ql_n + 1)) _ql_found=
		for _ql_f in /proc/[0123456789]*/stat; do
			_ql_r=${_ql_f#/proc/} _ql_r=${_ql_r%/stat}
			case " $$ $_ql_spare $_ql_dogs $_ql_child $_ql_last " in *" $_ql_r "*) continue ;; esac
			{ IFS= read -r _ql_l <"$_ql_f"; } 2>/dev/null || continue
			_ql_stat_of "${_ql_l##*)}"
			[ "$_ql_u" = "$$" ] || continue
			case " $_ql_spare $_ql_dogs " in *" $_ql_p "*) continue ;; esac
			case $_ql_x in Z | X) continue ;; esac
			kill -s STOP "$_ql_r" 2>/dev/null || continue
			if [ "$_ql_p" = "$$" ]; then _ql_last="$_ql_last $_ql_r"; else _ql_found="$_ql_found $_ql_r"; fi
		done
		[ -n "$_ql_found" ] || break
		# shellcheck disable=SC2086
		kill -s KILL $_ql_found 2>/dev/null
		_ql_sleep_ms 10
	done
	# shellcheck disable=SC2086
	[ -z "$_ql_last" ] || kill -s KILL $_ql_last 2>/dev/null
	if [ -n "$_ql_child" ]; then kill -s KILL "$_ql_child" 2>/dev/null; fi
}
# End helper $1 and its children (a sleep): stopped first, so that it forks nothing more. Its
# children are listed by /proc/PID/task/PID/children where the kernel has it (one read), else
# found by a scan of /proc.
_ql_kill_tree() {
	kill -s STOP "$1" 2>/dev/null || return 0
	if { read -r _ql_l <"/proc/$1/task/$1/children"; } 2>/dev/null || [ -f "/proc/$1/task/$1/children" ]; then
		# shellcheck disable=SC2086
		[ -z "$_ql_l" ] || kill -s KILL $_ql_l 2>/dev/null
		kill -s KILL "$1" 2>/dev/null
		return 0
	fi
	for _ql_f in /proc/[0123456789]*/stat; do
		{ IFS= read -r _ql_l <"$_ql_f"; } 2>/dev/null || continue
		_ql_stat_of "${_ql_l##*)}"
		if [ "$_ql_p" = "$1" ]; then
			_ql_r=${_ql_f#/proc/}
			kill -s KILL "${_ql_r%/stat}" 2>/dev/null
		fi
	done
	kill -s KILL "$1" 2>/dev/null
}
# KILL to everything in the task's cgroup (the launcher and its helpers are outside it).
_ql_cg_kill() {
	[ -z "$_ql_cg" ] || { echo 1 >"$_ql_cg/cgroup.kill"; } 2>/dev/null
}
# Does the task's cgroup still hold a process? Not when it is gone (the host's cancel may have
# removed it already): read with the builtin, no fork per look.
_ql_cg_populated() {
	IFS= read -r _ql_x 2>/dev/null <"$_ql_cg/cgroup.events" && [ "$_ql_x" = "populated 1" ]
}
# The run has ended: its cgroup goes when empty (a stopped one is waited for, at most 500 looks
# 10 ms apart: ~5 s; one a task left running after a normal exit stays until a sweep finds it
# empty). As launcher.c's cg_remove: wait while populated, then one rmdir - never a loop on an
# rmdir that fails because the cgroup is gone (that spun the full bound, 22 s under load).
_ql_cg_remove() {
	[ -n "$_ql_cg" ] || return 0
	_ql_n=0
	while [ -n "$1" ] && [ "$_ql_n" -lt 500 ] && _ql_cg_populated; do
		_ql_n=$((_ql_n + 1))
		_ql_sleep_ms 10
	done
	rmdir "$_ql_cg" 2>/dev/null
}
# Does the launcher lead its own process group (ql starts it as a session leader)?
_ql_leader=
if { IFS= read -r _ql_l </proc/$$/stat; } 2>/dev/null; then
	_ql_stat_of "${_ql_l##*)}"
	# qemu-user answers a process's read of its own stat with a made-up line (state 0, group 0):
	# then another process, a cat, reads it. A real kernel's state is always a letter.
	case $_ql_x in [!A-Za-z]*)
		_ql_l=$(cat "/proc/$$/stat" 2>/dev/null) && _ql_stat_of "${_ql_l##*)}" ;;
	esac
	[ "$_ql_u" = "$$" ] && _ql_leader=1
fi
# The KILL GRACE_MS after a TERM (a cancel's, forwarded by the trap; or the deadline's).
_ql_killer=
_ql_grace_killer() {
	trap '' HUP INT QUIT TERM USR1 USR2
	exec 3>&- 4<&- 5<&- >/dev/null 2>&1
	_ql_self
	_ql_sleep_ms "$_ql_lgrace"
	_ql_kill_group
	exit 0
}
# The deadline: TERM to the group at START_BOOT_MS + TIMEOUT_MS on the boot clock (without one:
# TIMEOUT_MS from now, which is after the true start - late, never early), KILL GRACE_MS later.
_ql_deadline() {
	trap '' HUP INT QUIT TERM USR1 USR2
	exec 3>&- 4<&- 5<&- >/dev/null 2>&1
	_ql_self
	if [ -n "$_ql_lstart" ] && _ql_boot_ms; then
		while _ql_boot_ms && [ "$((_ql_lstart + _ql_ltimeout - _ql_ms))" -gt 0 ]; do
			_ql_sleep_ms "$((_ql_lstart + _ql_ltimeout - _ql_ms + 10))"
		done
	else
		_ql_sleep_ms "$_ql_ltimeout"
	fi
	if [ -n "$_ql_leader" ]; then kill -s TERM 0; elif [ -n "$_ql_child" ]; then kill -s TERM "$_ql_child"; fi
	# Once more to CMD 0.2 s later: a deadline already past when the launcher starts fires while
	# the child may still be between its fork and its exec, where a shell drops a trapped signal
	# (docs/launcher.md, "Early signals"); a TERM it got already changes nothing.
	_ql_sleep_ms 200
	[ -z "$_ql_child" ] || kill -s TERM "$_ql_child" 2>/dev/null
	if [ -n "$_ql_lgrace" ]; then
		_ql_sleep_ms "$(($_ql_lgrace > 200 ? $_ql_lgrace - 200 : 0))"
		_ql_kill_group
	fi
	exit 0
}
# The quota: once a second, the log (fd 6) back to QUOTA_BYTES + 1 when it is longer (the extra
# byte tells the host's finalizer it was cut; docs/logs.md "Log quota").
_ql_quota() {
	trap '' HUP INT QUIT TERM USR1 USR2
	exec 3>&- 4<&- 5<&- >/dev/null 2>&1
	while sleep 1; do
		_ql_x=$(stat -L -c %s /proc/self/fd/6 2>/dev/null) || continue
		if _ql_uint "$_ql_x" && [ "$_ql_x" -gt "$((_ql_lquota + 1))" ]; then
			truncate -s "$((_ql_lquota + 1))" /proc/self/fd/6 2>/dev/null
		fi
	done
	exit 0
}
# Called by the wait loops while CMD still runs (see _ql_on_signal): start the KILL's timer once.
_ql_arm_killer() {
	if [ -n "$_ql_termed" ] && [ -n "$_ql_lgrace" ] && [ -z "$_ql_killer" ]; then
		_ql_grace_killer &
		_ql_killer=$!
	fi
}
_ql_dogs=
# Each helper is one fork (`name &`, a brace-bodied function) that ignores the forwarded signals
# first. The quota watcher comes first, so that the deadline's KILL spares it by pid.
_ql_start_helpers() {
	if [ -n "$_ql_lquota" ] && [ -e /proc/self/fd/6 ] && command -v stat >/dev/null 2>&1 &&
		command -v truncate >/dev/null 2>&1; then
		_ql_quota &
		_ql_dogs="$_ql_dogs $!"
	fi
	if [ -n "$_ql_ltimeout" ]; then
		_ql_deadline &
		_ql_dogs="$_ql_dogs $!"
	fi
}
_ql_end_helpers() {
	for _ql_x in $_ql_dogs $_ql_killer; do _ql_kill_tree "$_ql_x"; done
	_ql_dogs= _ql_killer=
	exec 6>&-
}

# The child: CMD with default dispositions, or the re-delivery of a signal that came first. A
# re-delivered signal always kills: the launcher could trap it, so it was not ignored on entry, and
# the child has it at the default (reset by the fork, or by env). KILL is only a backstop.
_ql_exec() {
	trap - HUP INT QUIT TERM USR1 USR2
	exec 3>&- 4<&- 5<&- 6>&-
	if [ -n "$_ql_cg" ]; then
		# Into the task's cgroup before any user code: the builtin echo writes "0", which moves this
		# subshell itself. The host made the cgroup before the go-ahead; made again here when a
		# sweep removed it while empty. Never outside it.
		_ql_n=0
		until { echo 0 >"$_ql_cg/cgroup.procs"; } 2>/dev/null; do
			mkdir "$_ql_cg" 2>/dev/null
			_ql_n=$((_ql_n + 1))
			if [ "$_ql_n" -ge 8 ]; then
				echo 'ql launcher: cannot enter the task'"'"'s cgroup; set [plugin.local] containment = "process-group"' >&2
				exit 126
			fi
		done
	fi
	if [ -n "$_ql_pending" ]; then
		set -- $_ql_pending
		set -- /bin/sh -c 'kill -s "$1" "$$"; kill -s KILL "$$"' sh "$1"
	fi
	if [ -n "$_ql_reset" ]; then
		# env would take a leading NAME=VALUE operand as an assignment; a fresh sh keeps it a command.
		# Every signal at its default (not only the forwarded ones): a nohup or `setsid ... &` host
		# leaves HUP, INT and QUIT ignored, and an ignored disposition survives exec.
		case $1 in *=*) exec env --default-signal /bin/sh -c 'exec "$@"' sh "$@" ;; esac
		exec env --default-signal -- "$@"
	fi
	exec "$@"
}

if [ -z "$_ql_reset" ]; then
	# Foreground mode. The launcher's own stdout/stderr become /dev/null first, so nothing the shell
	# prints (a notice about a killed child) reaches the log; CMD gets the log from fd 3, which the
	# launcher holds until CMD has ended. `$?` survives the traps that run right after the child.
	[ -n "$_ql_lquota" ] && exec 6>&1
	exec 3>&1 >/dev/null 2>&1
	_ql_start_helpers
	(_ql_exec "$@") >&3 2>&3
	_ql_w=$?
	exec 3>&-
	_ql_end_helpers
	trap '' HUP INT QUIT TERM USR1 USR2
	_ql_status=$_ql_w
	# Stopped (a TERM came while CMD ran: no trap runs until it ends): the rest of it goes too.
	case " $_ql_pending " in *" TERM "*) _ql_termed=1 ;; esac
else
	[ -n "$_ql_lquota" ] && exec 6>&1
	(_ql_exec "$@") &
	_ql_pid=$! _ql_child=$!
	_ql_start_helpers
	# From here on nothing the shell or its tools print (bash job notices included) can reach the
	# log, and the launcher no longer holds the log open.
	exec >/dev/null 2>&1
	# Caught between the fork and the line above: the child's copy did not have them. Those it had
	# are sent again, which changes nothing: it dies of the first signal either way.
	for _ql_s in HUP INT QUIT TERM USR1 USR2; do
		case "$_ql_pending " in *" $_ql_s "*) kill -s "$_ql_s" "$_ql_child" ;; esac
	done

	# Wait until the child no longer exists (`kill -0` fails once it is reaped; a zombie still
	# counts), forwarding signals meanwhile, then read its status with the forwarded signals
	# ignored (below).
	if [ -n "$_ql_pipe" ]; then
		# bash's `wait` is unsafe here: a trapped signal landing while it reaps the child (a group
		# signal does exactly that) longjmps out before the status is recorded, and the status is
		# lost. Sleeping in `read -t` instead lets traps run and lets bash reap the child in its
		# SIGCHLD handler, outside `wait`. SIGCHLD is blocked during a timed read, so this polls:
		# 10 ms growing to 100 ms, back to 10 ms after each signal (the child is then likely to end
		# soon).
		_ql_nap=0.01
		while kill -0 "$_ql_pid"; do
			_ql_arm_killer
			[ -n "$_ql_sig" ] && _ql_sig= _ql_nap=0.01
			read -r -t "$_ql_nap" -n 1 -u "$_ql_pipe" _ql_x
			# Over 128: the sleep timed out (or a trap ran). Anything else is EOF on the
			# acknowledged channel (the host died): no more sleeping there, `wait` takes over below.
			[ "$?" -gt 128 ] || { _ql_pipe=; break; }
			case $_ql_nap in 0.01) _ql_nap=0.02 ;; 0.02) _ql_nap=0.05 ;; 0.05) _ql_nap=0.1 ;; esac
		done
		[ "$_ql_pipe" = 4 ] && exec 4<&-
	fi
	if [ -z "$_ql_pipe" ]; then
		# dash and busybox ash: `wait` returns >128 both when the child died of a signal and when a
		# trapped signal interrupted it, so its answer is ignored here. A reaped pid can be reused:
		# if `wait` keeps returning without any signal while `kill -0` still finds the pid, that
		# process is not ours and we stop.
		_ql_spins=0
		while kill -0 "$_ql_pid"; do
			_ql_arm_killer
			if [ -n "$_ql_sig" ]; then _ql_spins=0; else _ql_spins=$((_ql_spins + 1)); fi
			[ "$_ql_spins" -gt 3 ] && break
			_ql_sig=
			wait "$_ql_pid"
		done
	fi
	# Nothing is left to forward to. With the signals ignored, `wait` reports the status the shell
	# recorded when it reaped the child (bash keeps it only outside POSIX mode, hence `set +o
	# posix`); ask until two answers agree, as bash may still answer 128+N once for a trap that
	# was pending.
	_ql_child=
	trap '' HUP INT QUIT TERM USR1 USR2
	_ql_status=none _ql_spins=0
	while [ "$_ql_spins" -lt 16 ]; do
		wait "$_ql_pid"
		_ql_w=$?
		[ "$_ql_w" = "$_ql_status" ] && break
		_ql_status=$_ql_w _ql_spins=$((_ql_spins + 1))
	done
	# Only now: a helper's end must not be the first news the shell gets of its jobs.
	_ql_end_helpers
fi
# A stopped task (a cancel's or the deadline's TERM came) whose command has ended: what it left
# running (moved out of the group, double-forked) is killed with it; then its cgroup goes.
[ -z "$_ql_termed" ] || _ql_cg_kill
_ql_cg_remove "$_ql_termed"
# A status the shell lost (bash's `wait` answers -1 after the race described above, possible on
# the fallback path) is never replaced by a made-up code: no receipt; the attempt will be lost.
[ "$_ql_w" = "$_ql_status" ] || exit 125
case $_ql_status in [0-9] | [1-9][0-9] | 1[0-9][0-9] | 2[0-4][0-9] | 25[0-5]) ;; *) exit 125 ;; esac

# Publication, byte for byte the store's protocol. In a subshell so umask 077 and noclobber never
# leak. The forwarded signals stay ignored, and its tools inherit that: a TERM to the group cannot
# kill ln or sync half way, and a completion that was already final still gets its receipt.
_ql_publish() (
	[ -n "$_ql_tok" ] || exit 1
	umask 077
	set -C

	# finishedAtMs must be an upper bound of the true finish time: read after reaping, rounded up.
	# On the start's clock when it is known: STARTED_AT_MS + the boot-clock time since START_BOOT_MS
	# (+10: /proc/uptime is rounded down to 1/100 s), never this launcher's wall clock.
	_ql_fin= _ql_t=${EPOCHREALTIME-}
	if [ -n "$_ql_lstart" ] && _ql_boot_ms; then
		_ql_fin=$((_ql_ms - _ql_lstart))
		[ "$_ql_fin" -ge 0 ] || _ql_fin=0
		_ql_fin=$((_ql_started + _ql_fin + 10))
	elif [ -n "$_ql_t" ] && [ "$_ql_t" != "$_ql_t0" ]; then
		_ql_s=${_ql_t%%[.,]*} _ql_us=${_ql_t#*[.,]}
		if _ql_uint "$_ql_s" && [ "${#_ql_us}" -eq 6 ] && _ql_uint "1$_ql_us"; then
			# "1" prefixes keep leading zeros from being read as octal.
			_ql_fin=$((_ql_s * 1000 + 1${_ql_us%???} - 1000 + (1${_ql_us#???} > 1000)))
		fi
	fi
	if [ -z "$_ql_fin" ]; then
		_ql_t=$(date +%s%3N 2>/dev/null)   # GNU date; %3N truncates, hence +1
		if _ql_uint "$_ql_t"; then _ql_fin=$((_ql_t + 1)); else
			_ql_t=$(date +%s 2>/dev/null)
			_ql_uint "$_ql_t" && _ql_fin=$(((_ql_t + 1) * 1000))
		fi
	fi
	_ql_uint "$_ql_fin" || exit 1   # no usable clock: a receipt never carries a guessed time
	[ "$_ql_fin" -ge "$_ql_started" ] || _ql_fin=$_ql_started

	# The token may only ever pass through the builtin printf, never an external command's argv.
	case $_ql_flags in
	*p*) ;;
	*) case $(command -V printf 2>/dev/null) in *builtin*) ;; *) exit 1 ;; esac ;;
	esac

	_ql_final=$_ql_shard/$_ql_attempt.json
	_ql_tmp=$_ql_shard/.$_ql_attempt.${$}t$_ql_fin.tmp
	[ -d "$_ql_shard" ] && [ ! -L "$_ql_shard" ] || exit 1
	# Never overwrite; this also keeps ln from linking into a directory of that name.
	for _ql_t in "$_ql_final" "$_ql_tmp"; do
		if [ -e "$_ql_t" ] || [ -L "$_ql_t" ]; then exit 1; fi
	done

	# noclobber makes the open exclusive; _ql_mine tells "could not create" (not ours: keep it)
	# from "created, but the write failed" (ours: remove it).
	_ql_f='{"schemaVersion":1,"runId":"%s","attemptId":"%s","callbackSequence":%s,"token":"%s",'
	_ql_f=$_ql_f'"startedAtMs":%s,"finishedAtMs":%s,"exitCode":%s}'
	_ql_mine=
	{
		_ql_mine=1
		printf "$_ql_f" "$_ql_run" "$_ql_attempt" "$_ql_seq" "$_ql_tok" "$_ql_started" "$_ql_fin" \
			"$_ql_status"
	} >"$_ql_tmp"
	if [ "$?" -ne 0 ]; then
		[ -n "$_ql_mine" ] && rm -f -- "$_ql_tmp"
		exit 1
	fi
	sync -- "$_ql_tmp"   # fsync where sync(1) takes files; failure means unsupported: go on
	# A hard link never replaces an existing name: the final name appears complete or not at all.
	if ! ln -- "$_ql_tmp" "$_ql_final"; then
		rm -f -- "$_ql_tmp"
		exit 1
	fi
	rm -f -- "$_ql_tmp"
	sync -- "$_ql_shard"
)

# Acknowledged completion: the host learns CMD's status from this launcher's own exit (waitpid:
# nothing a task writes can forge it), commits it, then says "ok" on the channel. One byte "s" sent
# first tells the host that this exit status is CMD's (without it, a 125 would be ambiguous: ours
# or CMD's). A publisher forked here keeps the receipt back and publishes it on anything but "ok"
# (EOF: the host died or gave up). It inherits the ignored signals and stays in the task's process
# group, so recovery still sees the attempt alive until it is done. A host already gone (the byte
# cannot be sent) gets the receipt at once, without a publisher.
if [ -n "$_ql_await" ]; then
	trap '' PIPE
	if { printf s >&5; } 2>/dev/null; then
		(
			# The wait for "ok" is bounded (ACK_WAIT_MS): a frozen host (SIGSTOP, a hung disk)
			# must not keep the receipt back for ever. Published after that, it duplicates what
			# the host may still commit, and the consumer discards it. A reader and a timer that
			# KILLs it: `read -t` is not POSIX (dash has none).
			(IFS= read -r _ql_ack <&5 2>/dev/null && [ "$_ql_ack" = ok ]) &
			_ql_r=$!
			exec 5<&-
			(_ql_sleep_ms "$_ql_lack"; kill -s KILL "$_ql_r" 2>/dev/null) &
			_ql_x=$!
			wait "$_ql_r"
			_ql_w=$?
			_ql_kill_tree "$_ql_x"
			[ "$_ql_w" = 0 ] && exit 0
			_ql_publish
		) &
		exit "$_ql_status"
	fi
	exec 5<&-
fi
_ql_publish
exit "$_ql_status"
}
