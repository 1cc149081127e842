/*
 * ql compiled launcher: the contract of launcher.sh, as one small C program.
 *
 *   ql-launcher SHARD_DIR RUN_ID ATTEMPT_ID CALLBACK_SEQUENCE STARTED_AT_MS MODE [LIMITS] -- CMD [ARG...]
 *
 * Same arguments, channel, exit statuses and receipt bytes as launcher.sh (read its header and
 * docs/launcher.md first); ql builds this file once per machine when a C compiler is available
 * (ql_executors/local_process/compiled.py) and falls back to launcher.sh otherwise. What differs:
 *
 * - No helper processes: every signal is reset to its default and the mask emptied in the child
 *   before exec (env --default-signal does the first for the shell; no shell tool does the
 *   second), the LIMITS are enforced from one poll() loop (see "Protections" below and
 *   docs/launcher.md), the status comes from waitpid on our own child
 *   (no `kill -0` polling, no pid-reuse guard needed), and the receipt is written with openat,
 *   write, fsync, linkat, unlinkat and a directory fsync (what printf, sync, ln and rm do); an
 *   fsync that fails for a reason other than "unsupported" publishes nothing.
 * - It starts clean whatever its host left: SIGCHLD at its default, the forwarded signals
 *   unblocked, every descriptor above 2 close-on-exec.
 * - No signal window around the fork: the forwarded signals are blocked across it. One that
 *   arrived before the fork is re-delivered by the child to itself, with default dispositions,
 *   instead of running CMD; one that arrives during the fork is forwarded once the child's pid is
 *   known. A signal sent to the launcher's pid alone is always forwarded (no foreground mode).
 *   A standby (below) that has no run yet exits 125 on a forwarded signal instead.
 * - MODE flags `e` and `p` are accepted and mean nothing here (they spare the shell a probe).
 *
 * Nothing here prints the command, its arguments, the environment or the token: the only line
 * this program ever writes to the log is "ql launcher: cannot run the command: <reason>".
 */
#define _GNU_SOURCE
#define _FILE_OFFSET_BITS 64 /* 32-bit userlands: a 64-bit inode number must not fail lstat/fstat */
#define _TIME_BITS 64
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__) && !defined(CLOSE_RANGE_CLOEXEC)
#define CLOSE_RANGE_CLOEXEC (1U << 2) /* the kernel's ABI value; glibc 2.34+ defines it itself */
#endif

#define LOST 125                            /* no status learnt, or the contract was broken */
#define MAX_SAFE 9007199254740991ULL        /* 2^53 - 1: exact in any JSON reader */
#define TOKEN_MIN 32
#define TOKEN_MAX 128

static const int FORWARDED[] = {SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};
#define N_FORWARDED ((int)(sizeof FORWARDED / sizeof FORWARDED[0]))

static volatile sig_atomic_t child_pid;     /* > 0 once CMD's process exists */
static volatile sig_atomic_t first_pending; /* the first signal caught before that */
static volatile sig_atomic_t idle_standby;  /* a standby that has no run yet */
static volatile sig_atomic_t term_seen;     /* a TERM was forwarded: the KILL after the grace is due */
static int wake_w = -1;                     /* the self-pipe's write end: wakes the wait loop */

static void wake_loop(void) {
    if (wake_w >= 0) {
        char b = 0;
        (void)!write(wake_w, &b, 1); /* non-blocking: a full pipe already means "wake up" */
    }
}

static void on_signal(int sig) {
    int saved = errno;
    pid_t child = (pid_t)child_pid;
    if (idle_standby)
        _exit(LOST); /* nothing of a run is here: a signal ends the standby, never a later run */
    if (child > 0)
        kill(child, sig);
    else if (!first_pending)
        first_pending = sig;
    if (sig == SIGTERM)
        term_seen = 1; /* what `ql cancel` sends: the KILL follows cancel_grace later (LIMITS) */
    wake_loop();
    errno = saved;
}

static void on_child(int sig) {
    (void)sig;
    int saved = errno;
    wake_loop();
    errno = saved;
}

extern char **environ;

/* launcher.sh unsets every _ql_ variable it inherits (it uses those names itself); CMD gets the
 * same environment whichever launcher ran it. */
static void drop_launcher_names(void) {
    char **from = environ, **to = environ;
    for (; *from; from++)
        if (strncmp(*from, "_ql_", 4) != 0)
            *to++ = *from;
    *to = NULL;
}

static int is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

/* Lowercase UUIDv7: 8-4-4-4-12 hex digits, version 7, variant 8..b. */
static int is_uuid7(const char *s) {
    if (strlen(s) != 36)
        return 0;
    for (int i = 0; i < 36; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            if (s[i] != '-')
                return 0;
        } else if (!is_hex(s[i])) {
            return 0;
        }
    }
    return s[14] == '7' && (s[19] == '8' || s[19] == '9' || s[19] == 'a' || s[19] == 'b');
}

/* A canonical JSON integer the receipt codec accepts: 0 .. 2^53-1, no sign, no leading zero. */
static int parse_uint(const char *s, unsigned long long *out) {
    size_t n = strlen(s);
    if (n == 0 || n > 16 || (s[0] == '0' && n > 1))
        return 0;
    unsigned long long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return 0;
        v = v * 10 + (unsigned long long)(s[i] - '0');
    }
    if (v > MAX_SAFE)
        return 0;
    *out = v;
    return 1;
}

static int is_token_char(char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

static ssize_t read_retry(int fd, void *buf, size_t n) {
    ssize_t r;
    do
        r = read(fd, buf, n);
    while (r < 0 && errno == EINTR);
    return r;
}

static int write_all(int fd, const char *buf, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, buf, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        buf += w;
        n -= (size_t)w;
    }
    return 0;
}

/* One line from fd: its length, or -1 for EOF before a newline, a read error, a line longer than
 * cap, or bytes after the newline. Read in chunks: the host writes the line in one piece and
 * nothing after it until this process is gone (the acknowledgement comes only after the host
 * reaped the launcher), so anything after the newline breaks the contract. */
static int read_line(int fd, char *line, int cap) {
    int n = 0;
    for (;;) {
        ssize_t got = read_retry(fd, line + n, (size_t)(cap + 1 - n));
        if (got <= 0)
            return -1;
        char *nl = memchr(line + n, '\n', (size_t)got);
        n += (int)got;
        if (nl != NULL) {
            if (nl != line + n - 1)
                return -1;
            *nl = '\0';
            return (int)(nl - line);
        }
        if (n > cap)
            return -1;
    }
}

/* A launcher with a run catches every forwarded signal, even one its host ignored (nohup,
 * `setsid ... &`): a cancel's TERM must reach CMD and start the KILL grace, and CMD gets the
 * defaults anyway. An idle standby (skip_ignored) leaves those ignored: such a signal ends
 * nothing, as for any process of that host. */
static void set_forwarded(void (*handler)(int), int skip_ignored) {
    for (int i = 0; i < N_FORWARDED; i++) {
        struct sigaction sa;
        if (skip_ignored && sigaction(FORWARDED[i], NULL, &sa) == 0 && sa.sa_handler == SIG_IGN)
            continue;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = handler;
        sigemptyset(&sa.sa_mask);
        for (int j = 0; j < N_FORWARDED; j++)
            sigaddset(&sa.sa_mask, FORWARDED[j]);
        sigaction(FORWARDED[i], &sa, NULL); /* no SA_RESTART: waitpid returns to us after each */
    }
}

struct receipt {
    const char *shard, *run, *attempt, *seq, *token;
    unsigned long long started, finished; /* finished: 0 = no usable clock, no receipt */
    int status;
};

/* finishedAtMs must be an upper bound of the true finish time: read right after reaping, rounded
 * up to the millisecond; 0 when the clock is unusable (a receipt never carries a guessed time). */
static unsigned long long finished_now(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0 || ts.tv_sec < 0)
        return 0;
    unsigned long long ms = (unsigned long long)ts.tv_sec * 1000ULL + (unsigned long long)ts.tv_nsec / 1000000ULL +
                            (ts.tv_nsec % 1000000 ? 1 : 0);
    return ms > MAX_SAFE ? 0 : ms;
}

/* fsync, where an error other than "not supported here" means the bytes may not be durable. */
static int flush(int fd) {
    if (fsync(fd) == 0)
        return 0;
    return (errno == EINVAL || errno == EROFS || errno == ENOTSUP || errno == EOPNOTSUPP) ? 0 : -1;
}

/* Publication, byte for byte the store's protocol (ADR-0007 §2.4), relative to one descriptor of
 * the shard opened without following symlinks: 0 when the receipt is there. */
static int publish(const struct receipt *r) {
    if (!r->token[0] || r->finished == 0)
        return 1;
    umask(077);
    unsigned long long fin = r->finished < r->started ? r->started : r->finished;
    char final_name[64], tmp_name[128], payload[1024];
    int n = snprintf(final_name, sizeof final_name, "%s.json", r->attempt);
    if (n < 0 || (size_t)n >= sizeof final_name)
        return 1;
    n = snprintf(tmp_name, sizeof tmp_name, ".%s.%ldt%llu.tmp", r->attempt, (long)getpid(), fin);
    if (n < 0 || (size_t)n >= sizeof tmp_name)
        return 1;
    n = snprintf(payload, sizeof payload,
                 "{\"schemaVersion\":1,\"runId\":\"%s\",\"attemptId\":\"%s\",\"callbackSequence\":%s,"
                 "\"token\":\"%s\",\"startedAtMs\":%llu,\"finishedAtMs\":%llu,\"exitCode\":%d}",
                 r->run, r->attempt, r->seq, r->token, r->started, fin, r->status);
    if (n < 0 || (size_t)n >= sizeof payload)
        return 1;
    int dir = open(r->shard, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dir < 0)
        return 1; /* missing, a symlink or not a directory: no receipt */
    struct stat sb;
    int failed = 1;
    /* Never overwrite; this also keeps linkat() from meeting a directory of that name. */
    if (fstatat(dir, final_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 || fstatat(dir, tmp_name, &sb, AT_SYMLINK_NOFOLLOW) == 0)
        goto out;
    int fd = openat(dir, tmp_name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        goto out; /* not created: whatever is there is not ours to remove */
    int bad = write_all(fd, payload, (size_t)n) != 0 || flush(fd) != 0;
    if (close(fd) != 0)
        bad = 1;
    /* A hard link never replaces an existing name: the final name appears complete or not at all. */
    if (bad || linkat(dir, tmp_name, dir, final_name, 0) != 0) {
        unlinkat(dir, tmp_name, 0);
        goto out;
    }
    unlinkat(dir, tmp_name, 0);
    flush(dir);
    failed = 0;
out:
    close(dir);
    return failed;
}

/* Every descriptor above 2 that is still open is kept from CMD (launcher.sh closes 3-5 itself; a
 * host other than ql's may pass more). One close_range call where the kernel has it (5.11+), else
 * the open descriptors listed in /proc/self/fd, else the first 1024: never one call per possible
 * descriptor (RLIMIT_NOFILE may be a million). */
static void mark_cloexec(int fd) {
    int flags = fcntl(fd, F_GETFD);
    if (flags >= 0 && !(flags & FD_CLOEXEC))
        fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
}

static void cloexec_from_3(void) {
#if defined(SYS_close_range) && defined(CLOSE_RANGE_CLOEXEC)
    if (syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) == 0)
        return;
#endif
    DIR *dir = opendir("/proc/self/fd");
    if (dir != NULL) {
        int own = dirfd(dir);
        struct dirent *entry;
        while ((entry = readdir(dir)) != NULL) {
            char *end;
            long fd = strtol(entry->d_name, &end, 10);
            if (*end == '\0' && end != entry->d_name && fd > 2 && fd != own && fd <= 0x7fffffffL)
                mark_cloexec((int)fd);
        }
        closedir(dir);
        return;
    }
    for (int fd = 3; fd < 1024; fd++)
        mark_cloexec(fd);
}

/* ------------------------------------------------------------------------------------------------
 * Containment (docs/launcher.md, "Containment"): with _ql_cgroup=PARENT in the launcher's
 * environment (a standby's: in its run's message; set by the host only where cgroup v2 is usable), CMD runs in the cgroup
 * PARENT/ATTEMPT_ID: the child creates it and moves itself there before it runs any user code.
 * The launcher stays outside, so cgroup.kill there reaches everything the task started (a setsid,
 * a double fork) but never the launcher, which still publishes the receipt. Names carry the
 * attempt id only.
 * ---------------------------------------------------------------------------------------------- */
#define CG_PATH_MAX 3200
static char cg_dir[CG_PATH_MAX]; /* PARENT/ATTEMPT_ID, or "" (the process group only) */
/* cg_dir's length plus room for "/cgroup.events" and its NUL. */
#define CG_FILE_MAX (CG_PATH_MAX + 16)

/* DIR "/" NAME into BUF (room for both: the callers' sizes say so). No printf: a standby the factory
 * forked faults in every page of code and data it touches first, and the printf machinery is
 * several (docs/launcher.md, "Standby factory"). */
static char *join_path(char *buf, const char *dir, const char *name) {
    size_t d = strlen(dir), n = strlen(name);
    memcpy(buf, dir, d);
    buf[d] = '/';
    memcpy(buf + d + 1, name, n + 1);
    return buf;
}

/* A file of the task's cgroup, in a buffer of the caller's (CG_FILE_MAX): built where it is used,
 * not kept beside cg_dir — the usual task opens none of them, and each kept path was one more
 * page to fault in. */
static char *cg_file(char *buf, const char *leaf) { return join_path(buf, cg_dir, leaf); }

static void cg_setup(const char *parent, const char *attempt) {
    cg_dir[0] = '\0';
    if (parent == NULL || parent[0] != '/' || strlen(parent) > CG_PATH_MAX - 100)
        return;
    join_path(cg_dir, parent, attempt); /* a checked uuid: 36 bytes */
}

/* In the (v)fork child: into the task's cgroup, made here (again, when a sweep removed it while
 * empty). 0, or the errno of the last try. Allocates nothing. */
static int cg_enter(void) {
    int err = 0;
    char procs[CG_FILE_MAX];
    cg_file(procs, "cgroup.procs");
    for (int i = 0; i < 8; i++) {
        if (mkdir(cg_dir, 0755) != 0 && errno != EEXIST) {
            err = errno;
            continue;
        }
        int fd = open(procs, O_WRONLY | O_CLOEXEC);
        if (fd < 0) {
            err = errno;
            continue;
        }
        ssize_t w = write(fd, "0", 1); /* "0": the writing process itself */
        err = w == 1 ? 0 : errno;
        close(fd);
        if (err == 0)
            return 0;
    }
    return err != 0 ? err : EIO;
}

/* clone3(CLONE_INTO_CGROUP | CLONE_VFORK) (Linux 5.7+): the child starts in the task's cgroup.
 * Moving a process later (a write to cgroup.procs) costs ~0.4 ms on this kernel (it waits for an
 * RCU grace period); this is a fork. The child runs child_after_fork(ARG) and never returns here.
 * Where clone3_vm (below) exists, it is CLONE_VM as well: the child shares the launcher's memory
 * like a vfork child, on a stack of its own, so the kernel neither copies the launcher's page
 * tables nor tears the copy down at the child's exec (~0.1 ms of CPU per task, most of it the
 * copy's TLB shootdown: perf, bench/bench_cpu_split.py). Elsewhere it is not CLONE_VM: the
 * raw syscall returns through a C frame in the child, which must not share the parent's stack.
 * The child's pid, or -1 when it did not happen (no clone3, no such cgroup: the caller forks the
 * old way and the child moves itself). */
#define QL_CLONE_INTO_CGROUP 0x200000000ULL
#ifndef SYS_clone3
#define SYS_clone3 435 /* one number on every architecture */
#endif
struct ql_clone_args {
    unsigned long long flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid,
        set_tid_size, cgroup;
};

/* The most words a command may have for a child on clone3_vm's own stack (below): glibc's execvp
 * copies the argument vector onto the stack to retry a script through /bin/sh, so a longer command
 * takes the copying clone3. */
#define CLONE_VM_MAX_ARGS 65536

/* What child_after_fork needs, in one pointer (clone3_vm passes one argument). */
struct child_args {
    const struct task *t;
    char **via_sh;
    const sigset_t *forwarded;
    int in_cgroup; /* started in the task's cgroup (clone3): no cg_enter */
    int words;     /* CMD's words (at most CLONE_VM_MAX_ARGS + 1 counted) */
};
__attribute__((noreturn, noinline)) static void child_after_fork(struct child_args *a);

#if defined(__x86_64__) && !defined(__ILP32__) /* not x32: other syscall numbers */
/* x86_64 only: the one architecture where this path is exercised by the tests (qemu-user, which
 * runs the AArch64 launcher's tests, answers clone3 with ENOSYS). */
#define QL_HAVE_CLONE3_VM 1
/* The CLONE_VM child's stack: room for CLONE_VM_MAX_ARGS pointers and execvp's path buffer, with
 * plenty to spare. BSS: untouched pages cost nothing. */
#define CLONE_VM_STACK (1024 * 1024)
static unsigned char vm_stack[CLONE_VM_STACK] __attribute__((aligned(64)));

/* clone3 with a stack: the kernel starts the child on that stack right after the syscall
 * instruction, where no C frame is valid, so the child's side is this assembly: it calls FN(ARG)
 * (which never returns; exit 125 if it did). The parent, suspended by CLONE_VFORK until the child
 * has exec'd or exited, gets the child's pid (or -errno) back as from the raw syscall. */
static long clone3_vm(struct ql_clone_args *args, void (*fn)(struct child_args *), struct child_args *arg) {
    register long rax __asm__("rax") = SYS_clone3;
    register struct ql_clone_args *rdi __asm__("rdi") = args;
    register unsigned long rsi __asm__("rsi") = sizeof *args;
    register void (*r12)(struct child_args *) __asm__("r12") = fn;
    register struct child_args *r13 __asm__("r13") = arg;
    __asm__ volatile("syscall\n\t"
                     "test %%rax, %%rax\n\t"
                     "jnz 1f\n\t"
                     "xor %%ebp, %%ebp\n\t" /* the child: its first frame */
                     "mov %%r13, %%rdi\n\t"
                     "call *%%r12\n\t"
                     "mov $125, %%edi\n\t"
                     "mov $231, %%eax\n\t" /* exit_group */
                     "syscall\n\t"
                     "hlt\n"
                     "1:\n\t"
                     : "+r"(rax)
                     : "r"(rdi), "r"(rsi), "r"(r12), "r"(r13)
                     : "rcx", "r11", "cc", "memory");
    return rax;
}
#endif

static pid_t fork_into_cgroup(struct child_args *child) {
    int fd = open(cg_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT && mkdir(cg_dir, 0755) == 0) /* a sweep removed it while empty */
        fd = open(cg_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct ql_clone_args args;
    memset(&args, 0, sizeof args);
    args.flags = QL_CLONE_INTO_CGROUP | CLONE_VFORK;
    args.exit_signal = SIGCHLD;
    args.cgroup = (unsigned long long)fd;
    child->in_cgroup = 1;
    long pid = -1;
#ifdef QL_HAVE_CLONE3_VM
    if (child->words <= CLONE_VM_MAX_ARGS) {
        args.flags |= CLONE_VM;
        args.stack = (unsigned long long)(unsigned long)vm_stack;
        args.stack_size = sizeof vm_stack;
        pid = clone3_vm(&args, child_after_fork, child);
        /* Refused (a seccomp filter, an old kernel's stricter checks): the copying clone3 is
         * tried next; ENOSYS/E2BIG end in the fallback below. */
        if (pid < 0)
            args.flags &= ~(unsigned long long)CLONE_VM, args.stack = args.stack_size = 0;
    }
    if (pid < 0)
#endif
    {
        pid = syscall(SYS_clone3, &args, sizeof args);
        if (pid == 0)
            child_after_fork(child); /* a copy of the launcher: its own memory */
    }
    close(fd);
    child->in_cgroup = 0;
    return pid > 0 ? (pid_t)pid : -1;
}

static int cg_killed; /* cgroup.kill was written: the removal waits for the cgroup to empty */

/* KILL to every process of the task's cgroup (the launcher is not one of them). */
static void cg_kill(void) {
    if (!cg_dir[0])
        return;
    char path[CG_FILE_MAX];
    int fd = open(cg_file(path, "cgroup.kill"), O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    if (write(fd, "1", 1) == 1)
        cg_killed = 1;
    close(fd);
}

/* Is the task's cgroup empty (or gone)? */
static int cg_empty(void) {
    char buf[256], path[CG_FILE_MAX];
    int fd = open(cg_file(path, "cgroup.events"), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 1;
    ssize_t n = read_retry(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    return strstr(buf, "populated 0") != NULL;
}

/* The run has ended: remove its cgroup when empty. After a cgroup.kill, wait until the
 * killed are gone (bounded: 5 s); one a task left running after a normal exit keeps it (a
 * sweep removes it once empty). */
static void cg_remove(void) {
    if (!cg_dir[0])
        return;
    for (int i = 0; cg_killed && i < 2500 && !cg_empty(); i++) {
        struct timespec pause = {0, 2000000};
        nanosleep(&pause, NULL);
    }
    rmdir(cg_dir);
}

/* What `ql-launcher --probe` prints: ql checks a build by its output, not by an exit status (a
 * host that ignores SIGCHLD gets no exit status from any child). */
static const char PROBE_ANSWER[] = "ql-launcher ok\n";

/* ------------------------------------------------------------------------------------------------
 * LIMITS: what this launcher enforces itself, host or no host, reader or none (docs/launcher.md,
 * "Protections"). One word of five comma-separated fields, each a canonical integer or empty
 * (= none), in argv right before "--" (optional there: without it nothing is enforced) and in the
 * standby message right after MODE:
 *
 *   START_BOOT_MS,TIMEOUT_MS,GRACE_MS,QUOTA_BYTES,ACK_WAIT_MS
 *
 * START_BOOT_MS is CLOCK_BOOTTIME (ms) when the host committed the attempt's start (STARTED_AT_MS):
 * the deadline is START_BOOT_MS + TIMEOUT_MS on that clock, and finishedAtMs = STARTED_AT_MS + the
 * boottime elapsed since — never this launcher's wall clock (which may differ from the host's, or
 * step). GRACE_MS: KILL to the group that long after a TERM (a cancel's, or the deadline's).
 * QUOTA_BYTES: the log is cut back to QUOTA_BYTES + 1 at most once a second while it is written
 * (the extra byte tells the host's finalizer that it was cut). ACK_WAIT_MS: how long an
 * acknowledged publisher waits for the host's "ok" before it publishes anyway.
 * ---------------------------------------------------------------------------------------------- */
#define ACK_WAIT_MS_DEFAULT 30000ULL /* launch.py ACK_WAIT_MS */
#define QUOTA_CHECK_MS 1000          /* at most one size check a second while the log grows */
#define QUOTA_WATCH_AFTER_MS 100     /* the log's watch is set up only once CMD has run this long */
#define KILL_SCANS 64                /* bounded rounds of "KILL every other member of the group" */

struct limits {
    int has_start, has_timeout, has_grace, has_quota;
    unsigned long long start_boot_ms, timeout_ms, grace_ms, quota, ack_ms;
};

static int parse_limit(const char *s, size_t n, int *has, unsigned long long *out) {
    char field[24];
    if (n == 0) {
        *has = 0;
        return 1;
    }
    if (n >= sizeof field)
        return 0;
    memcpy(field, s, n);
    field[n] = '\0';
    *has = 1;
    return parse_uint(field, out);
}

static int parse_limits(const char *word, struct limits *l) {
    const char *p = word;
    int has_ack = 0;
    int *has[5] = {&l->has_start, &l->has_timeout, &l->has_grace, &l->has_quota, &has_ack};
    unsigned long long *val[5] = {&l->start_boot_ms, &l->timeout_ms, &l->grace_ms, &l->quota, &l->ack_ms};
    for (int i = 0; i < 5; i++) {
        const char *comma = strchr(p, ',');
        if ((i < 4) != (comma != NULL))
            return 0;
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        if (!parse_limit(p, n, has[i], val[i]))
            return 0;
        p = comma ? comma + 1 : p + n;
    }
    if (!has_ack)
        l->ack_ms = ACK_WAIT_MS_DEFAULT;
    return 1;
}

/* CLOCK_BOOTTIME in ns: counts suspend, never steps; 0 when unusable. */
static unsigned long long boot_ns(void) {
    struct timespec ts;
    /* The system call, not the vDSO: a standby the factory forked would fault in the vDSO's code
     * and data pages (two faults, more than the few calls of a run cost as system calls). */
    if (syscall(SYS_clock_gettime, CLOCK_BOOTTIME, &ts) != 0 || ts.tv_sec < 0)
        return 0;
    return (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec;
}

/* One run, however it reached us: from argv and the token line, or from a standby's spec. */
struct task {
    struct limits lim;
    struct receipt rec;
    char **cmd;       /* CMD ARG... (shell mode: /bin/sh -c WORD) */
    char **envp;      /* standby: CMD's environment; argv mode: NULL (ours, as inherited) */
    const char *cwd;  /* standby: "" = the host's directory (cwd_fd), else relative to it */
    int log_fd;       /* standby: the log artifact (CMD's stdout/stderr); -1 in argv mode */
    int cwd_fd;       /* standby: the host's working directory at hand-over; -1 in argv mode */
    int awaited;
};

/* finishedAtMs on the start's clock: STARTED_AT_MS + the CLOCK_BOOTTIME elapsed since the host's
 * START_BOOT_MS, rounded up (an upper bound, like finished_now) — the verdict then compares the
 * committed start plus durations, never our wall clock with the submitter's. Without START_BOOT_MS
 * (or a usable clock): the wall clock. */
static unsigned long long finished_at(const struct task *t) {
    unsigned long long now = boot_ns();
    if (!t->lim.has_start || now == 0)
        return finished_now();
    unsigned long long start_ns = t->lim.start_boot_ms * 1000000ULL;
    unsigned long long elapsed = now > start_ns ? now - start_ns : 0;
    unsigned long long ms = t->rec.started + elapsed / 1000000ULL + (elapsed % 1000000ULL ? 1 : 0);
    return ms > MAX_SAFE ? 0 : ms;
}

static char *shell_cmd[4] = {"/bin/sh", "-c", NULL, NULL};

/* MODE and its flags: 1 when valid; sets the shell word when mode is "shell". */
static int parse_mode(const char *mode, int n_words, char **words, struct task *t) {
    const char *flags = strchr(mode, '+');
    size_t mode_len = flags ? (size_t)(flags - mode) : strlen(mode);
    flags = flags ? flags + 1 : "";
    if (strspn(flags, "cepa") != strlen(flags))
        return 0;
    t->awaited = strchr(flags, 'a') != NULL;
    if (mode_len == 4 && strncmp(mode, "argv", 4) == 0 && n_words >= 1) {
        t->cmd = words;
        return 1;
    }
    if (mode_len == 5 && strncmp(mode, "shell", 5) == 0 && n_words == 1) {
        shell_cmd[2] = words[0];
        t->cmd = shell_cmd;
        return 1;
    }
    return 0;
}

/* The fields every launcher checks, exactly as launcher.sh and the receipt codec do. */
static int valid_ids(struct receipt *r, const char *started) {
    unsigned long long seq;
    return r->shard != NULL && r->run != NULL && r->attempt != NULL && r->seq != NULL && started != NULL &&
           r->shard[0] == '/' && is_uuid7(r->run) && is_uuid7(r->attempt) && parse_uint(r->seq, &seq) && seq >= 1 &&
           parse_uint(started, &r->started);
}

static int valid_token(const char *token, size_t len) {
    if (len < TOKEN_MIN || len > TOKEN_MAX)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!is_token_char(token[i]))
            return 0;
    return 1;
}

/* ------------------------------------------------------------------------------------------------
 * Standby mode: `ql-launcher --standby`, started by a host before any run exists (stdin: one end of
 * a SOCK_SEQPACKET socketpair; stdout/stderr: /dev/null; its own session). It holds nothing of any
 * run until one message arrives: the spec and the go-ahead at once (the host sends it only after
 * committing this process's handle with the run). EOF, or a message that breaks the format:
 * exit 125, nothing run, no receipt. The message (all fields NUL-terminated, in this order):
 *
 *   "ql-standby-2" SHARD_DIR RUN_ID ATTEMPT_ID CALLBACK_SEQUENCE STARTED_AT_MS MODE LIMITS CWD
 *   ARGC ARG... ENVC NAME=VALUE... TOKEN
 *
 * with exactly two descriptors (SCM_RIGHTS): the log artifact, and the host's working directory
 * (CMD runs there, or in CWD relative to it). Nothing of it ever appears in our argv or environment.
 * ---------------------------------------------------------------------------------------------- */
#define SPEC_MAX (192 * 1024) /* ql_executors/local_process/launch.py STANDBY_SPEC_MAX */
#define SPEC_FDS 2
static char spec[SPEC_MAX + 1];

/* Pointer arrays (a run's words, shell_fallback's) go into spec past the message while they fit,
 * else to calloc: the message's own page is written already, and in a standby the factory forked
 * every other page — the heap's, malloc's own state, malloc's code — is one more fault (about 4 µs
 * on a small VM). set by receive_spec; never freed (the launcher runs one run). */
static char *spare, *spare_end;

static char **new_words(size_t n) {
    size_t need = n * sizeof(char *);
    if (spare != NULL && need <= (size_t)(spare_end - spare)) {
        char **words = (char **)(void *)spare;
        spare += need;
        memset(words, 0, need);
        return words;
    }
    return calloc(n, sizeof(char *));
}

static int in_spare(const void *p) { return (const char *)p >= spec && (const char *)p < spec + sizeof spec; }

static const char *next_field(char **p, const char *end) {
    if (*p >= end)
        return NULL;
    char *field = *p;
    char *nul = memchr(field, '\0', (size_t)(end - field));
    if (nul == NULL)
        return NULL;
    *p = nul + 1;
    return field;
}

/* n words from the spec into a new NULL-terminated array; NULL when the spec has fewer. */
static char **next_words(char **p, const char *end, unsigned long long n) {
    char **words = new_words((size_t)n + 1);
    if (words == NULL)
        return NULL;
    for (unsigned long long i = 0; i < n; i++) {
        const char *w = next_field(p, end);
        if (w == NULL) {
            if (!in_spare(words))
                free(words);
            return NULL;
        }
        words[i] = (char *)w;
    }
    return words;
}

/* How often an idle standby checks that the host that owns it is still there: after its owner's
 * death it exits within this long, whoever still holds the other end of its channel. */
#define OWNER_CHECK_MS 1000

static pid_t channel_owner(int channel) {
    struct ucred owner;
    socklen_t len = sizeof owner;
    if (getsockopt(channel, SOL_SOCKET, SO_PEERCRED, &owner, &len) != 0 || len != sizeof owner || owner.pid <= 0)
        return 0; /* not a socket pair we can ask: EOF alone decides, as before */
    return owner.pid;
}

/* The owner of a standby forked by a factory (below): the factory's own owner, which it was forked
 * to be the child of (CLONE_PARENT); 0 otherwise (the creator of the channel's socket pair). */
static pid_t forked_owner;

/* An idle standby waits for its message on the channel AND for its owner's death. EOF on the
 * channel is not enough: a host that forked through libc (no after-fork hook ran) left a copy of
 * its end in the child, and that copy keeps the channel open after the host itself died. The owner
 * is the process that created the socket pair (SO_PEERCRED: nothing to pass, nothing in argv), or
 * for a standby a factory forked, the factory's owner;
 * while it is our parent, a changed parent (we were reparented: it died) says it is gone — no pid
 * is ever compared after it could have been reused. Started through an intermediary (a tracer, say),
 * the owner's pid is asked instead. No descriptor is held for it: an idle standby holds nothing but
 * its channel. 1: the channel has something (a message, or EOF); 0: the owner is gone and left
 * nothing. */
static int wait_for_message(int channel) {
    pid_t owner = forked_owner > 0 ? forked_owner : channel_owner(channel);
    int parent = owner > 0 && getppid() == owner;
    struct pollfd fd = {.fd = channel, .events = POLLIN};
    for (;;) {
        /* Its owner gone: a message already waiting still decides. The host sends it only after the
         * create commit, and it is the go-ahead: a host that died right after sending it (before we
         * even got here, or between two checks) recorded the run as running with this launcher. */
        if (owner > 0 && (parent ? getppid() != owner : kill(owner, 0) != 0 && errno == ESRCH))
            return poll(&fd, 1, 0) > 0;
        int r = poll(&fd, 1, owner > 0 ? OWNER_CHECK_MS : -1);
        if (r > 0 || (r < 0 && errno != EINTR))
            return 1; /* a message, EOF, or no way to wait: recvmsg decides as it always did */
    }
}

static int receive_spec(int channel, struct task *t) {
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int) * (SPEC_FDS + 2))]; /* room to see (and close) extra fds */
    } control;
    struct iovec iov = {.iov_base = spec, .iov_len = sizeof spec};
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.buf;
    msg.msg_controllen = sizeof control.buf;
    ssize_t n;
    if (!wait_for_message(channel))
        return 0; /* its owner died idle: nothing is ever run for it (125, like EOF) */
    do /* a forwarded signal here ends the idle standby (on_signal): no run is ever charged with it */
        n = recvmsg(channel, &msg, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    int fds[SPEC_FDS + 2], n_fds = 0;
    if (n >= 0)
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c))
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
                for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
                    int fd;
                    memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
                    if (n_fds < SPEC_FDS + 2)
                        fds[n_fds++] = fd;
                    else
                        close(fd);
                }
    /* n <= SPEC_MAX: the buffer has one byte more than the largest message so that a message of
     * SPEC_MAX + 1 bytes, which MSG_TRUNC does not flag, is seen to be too long too. */
    int ok = n > 0 && n <= SPEC_MAX && !(msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) && n_fds == SPEC_FDS &&
             spec[n - 1] == '\0';
    if (ok) { /* past the message, aligned for pointers */
        size_t at = ((size_t)n + sizeof(char *) - 1) & ~(sizeof(char *) - 1);
        spare = at < sizeof spec ? spec + at : NULL;
        spare_end = spec + sizeof spec;
    }
    char *p = spec;
    const char *end = spec + (ok ? n : 0);
    const char *magic = next_field(&p, end);
    const char *mode = NULL, *started = NULL, *argc_s = NULL, *envc_s = NULL, *token = NULL, *limits = NULL;
    unsigned long long n_args = 0, n_env = 0;
    char **args = NULL;
    if (ok && magic != NULL && strcmp(magic, "ql-standby-2") == 0) {
        t->rec.shard = next_field(&p, end);
        t->rec.run = next_field(&p, end);
        t->rec.attempt = next_field(&p, end);
        t->rec.seq = next_field(&p, end);
        started = next_field(&p, end);
        mode = next_field(&p, end);
        limits = next_field(&p, end);
        t->cwd = next_field(&p, end);
        argc_s = next_field(&p, end);
    } else {
        ok = 0;
    }
    ok = ok && argc_s != NULL && parse_uint(argc_s, &n_args) && n_args >= 1 && n_args <= SPEC_MAX &&
         (args = next_words(&p, end, n_args)) != NULL;
    ok = ok && (envc_s = next_field(&p, end)) != NULL && parse_uint(envc_s, &n_env) && n_env <= SPEC_MAX &&
         (t->envp = next_words(&p, end, n_env)) != NULL;
    ok = ok && (token = next_field(&p, end)) != NULL && p == end;
    ok = ok && limits != NULL && parse_limits(limits, &t->lim);
    ok = ok && valid_ids(&t->rec, started) && parse_mode(mode, (int)n_args, args, t) &&
         valid_token(token, strlen(token));
    for (unsigned long long i = 0; ok && i < n_env; i++)
        ok = t->envp[i][0] != '=' && strchr(t->envp[i], '=') != NULL;
    if (!ok) {
        for (int i = 0; i < n_fds; i++)
            close(fds[i]);
        return 0;
    }
    t->rec.token = token;
    t->log_fd = fds[0];
    t->cwd_fd = fds[1];
    return 1;
}

/* A standby may wait for hours: nothing its host left open may stay open in it (ql's host closes
 * its descriptors when it spawns one; a host of another kind may not). Everything above 2 but the
 * channel is closed, not just marked close-on-exec. */
static void close_from_3_except(int keep) {
#if defined(SYS_close_range)
    if ((keep == 3 || syscall(SYS_close_range, 3U, (unsigned)keep - 1, 0U) == 0) &&
        syscall(SYS_close_range, (unsigned)keep + 1, ~0U, 0U) == 0)
        return;
#endif
    for (;;) { /* close after each walk, not during it: at most 256 per walk */
        DIR *dir = opendir("/proc/self/fd");
        if (dir == NULL)
            break;
        int own = dirfd(dir), found[256], n = 0;
        struct dirent *entry;
        while ((entry = readdir(dir)) != NULL && n < 256) {
            char *end;
            long fd = strtol(entry->d_name, &end, 10);
            if (*end == '\0' && end != entry->d_name && fd > 2 && fd != keep && fd != own && fd <= 0x7fffffffL)
                found[n++] = (int)fd;
        }
        closedir(dir);
        for (int i = 0; i < n; i++)
            close(found[i]);
        if (n < 256)
            return;
    }
    cloexec_from_3(); /* what cannot be closed is at least kept from CMD */
}

/* ------------------------------------------------------------------------------------------------
 * Factory mode: `ql-launcher --factory`, started exactly as a standby (its channel a SOCK_SEQPACKET
 * socketpair on stdin, stdout/stderr /dev/null, its own session, an empty environment, in /) by a
 * host that keeps standbys ready, and holding as little: nothing of any run, ever. For each request
 * (one byte "n") it forks one standby that is the *host's* child (CLONE_PARENT: the host waits for,
 * reaps and signals it through a pidfd, as one it started itself), which leads a new session, names
 * itself --standby (same length as --factory: ps shows what it is) and answers the host itself, once
 * that is done: its pid as text with the host's end of its own new channel (SCM_RIGHTS). A failure
 * answers "e" (no descriptor); anything else, EOF or the owner's death ends the factory (125).
 * Why: every exec of a static glibc program runs its start-up CPU probes (cpuid, trapped by a
 * hypervisor: ~0.5 ms on a small VM, more than the rest of the launcher); a fork of a process that
 * has run them already skips them (docs/launcher.md, "Standby factory").
 * ---------------------------------------------------------------------------------------------- */
static int fork_standby(int channel, pid_t owner, char **argv) {
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0)
        return -1;
    /* A raw clone: glibc's fork() cannot make a sibling. Single-threaded, as the launcher always is;
     * the child only uses what fork() would have left it (no thread id, no lock owner survives). */
    long pid = syscall(SYS_clone, (unsigned long)(CLONE_PARENT | SIGCHLD), 0, 0, 0, 0);
    if (pid == 0) {
        /* The new standby: led by nothing of the factory's, told apart from it in ps. */
        forked_owner = owner;
        if (setsid() < 0 || getppid() != owner)
            _exit(LOST); /* not the owner's child after all (it died): nobody could ever use us */
        memcpy(argv[1], "--standby", 9);
        char reply[24]; /* our pid in decimal (no printf: see join_path) */
        int len = 0;
        for (unsigned long v = (unsigned long)getpid(); len == 0 || v > 0; v /= 10)
            reply[len++] = (char)('0' + v % 10);
        for (int i = 0; i < len / 2; i++) {
            char c = reply[i];
            reply[i] = reply[len - 1 - i];
            reply[len - 1 - i] = c;
        }
        union {
            struct cmsghdr align;
            char buf[CMSG_SPACE(sizeof(int))];
        } control;
        struct iovec iov = {.iov_base = reply, .iov_len = (size_t)len};
        struct msghdr msg;
        memset(&msg, 0, sizeof msg);
        memset(&control, 0, sizeof control);
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.buf;
        msg.msg_controllen = sizeof control.buf;
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &pair[0], sizeof(int));
        ssize_t sent;
        do
            sent = sendmsg(channel, &msg, MSG_NOSIGNAL);
        while (sent < 0 && errno == EINTR);
        if (sent != len)
            _exit(LOST); /* the host never learns of us: EOF on our channel would end us anyway */
        close(pair[0]);
        close(channel); /* the factory's: nothing of it stays in the standby */
        return pair[1];
    }
    close(pair[0]);
    close(pair[1]);
    return pid > 0 ? 0 : -1;
}

/* The factory's loop; returns only in a standby it forked, with that standby's channel. */
static int serve_standbys(int channel, char **argv) {
    pid_t owner = channel_owner(channel);
    if (owner <= 0 || getppid() != owner)
        _exit(LOST); /* started through an intermediary: its forks would not be the host's children */
    for (;;) {
        if (!wait_for_message(channel))
            _exit(LOST); /* the owner died */
        char request[8];
        ssize_t n;
        do
            n = recv(channel, request, sizeof request, 0);
        while (n < 0 && errno == EINTR);
        if (n != 1 || request[0] != 'n')
            _exit(LOST); /* EOF (the host let go of us), or not the contract */
        int made = fork_standby(channel, owner, argv);
        if (made > 0)
            return made; /* in the new standby */
        if (made < 0 && send(channel, "e", 1, MSG_NOSIGNAL) != 1)
            _exit(LOST);
    }
}

/* The fallback for an executable file without #!: it runs as a shell script, as under launcher.sh
 * (glibc's execvp does this itself; musl's does not): `sh -c 'exec "$0" "$@"' CMD ARG...`. Built
 * before the fork: the child of a vfork must not allocate. */
__attribute__((noinline)) static char **shell_fallback(char **cmd) {
    int n = 0;
    while (cmd[n])
        n++;
    char **via_sh = new_words((size_t)n + 4);
    if (via_sh != NULL) {
        via_sh[0] = "sh";
        via_sh[1] = "-c";
        via_sh[2] = "exec \"$0\" \"$@\"";
        for (int i = 0; i < n; i++)
            via_sh[3 + i] = cmd[i];
    }
    return via_sh;
}

/* The child's path to CMD: in the working directory and environment of the run (standby). It runs
 * in a vfork child, on the launcher's memory until it execs or exits: it allocates nothing, returns
 * never, and runs no signal handler (the forwarded signals are blocked until their dispositions are
 * the defaults again). What it writes — environ, the in-place filtering of the environment — only
 * the child's exec reads; the launcher itself never looks at its environment again. */
__attribute__((noreturn)) static void exec_command(const struct task *t, char **via_sh) {
    const char *failed_to = "run the command";
    if (t->log_fd >= 0 && (dup2(t->log_fd, 1) < 0 || dup2(t->log_fd, 2) < 0))
        _exit(LOST); /* nowhere to report to, and CMD must not write into /dev/null unknowingly */
    if (t->cwd_fd >= 0 && (fchdir(t->cwd_fd) < 0 || (t->cwd[0] != '\0' && chdir(t->cwd) < 0)))
        failed_to = "enter the working directory";
    else {
        if (t->envp != NULL)
            environ = t->envp;
        drop_launcher_names();
        execvp(t->cmd[0], t->cmd);
    }
    int err = errno;
    if (err == ENOEXEC && via_sh != NULL)
        execv("/bin/sh", via_sh); /* the shell searches and falls back again */
    static const char prefix[] = "ql launcher: cannot ";
    const char *reason = strerror(err);
    if (write_all(2, prefix, sizeof prefix - 1) == 0 && write_all(2, failed_to, strlen(failed_to)) == 0 &&
        write_all(2, ": ", 2) == 0 && write_all(2, reason, strlen(reason)) == 0)
        write_all(2, "\n", 1);
    /* What a shell answers for "not found" / "cannot execute"; a directory that cannot be entered
     * (only if it went away after the host checked it) is "cannot execute" too. */
    _exit(err == ENOENT && strcmp(failed_to, "run the command") == 0 ? 127 : 126);
}

/* The signals that were ignored when this process started: a standby the factory forked inherits
 * the factory's list (read once per factory, not once per task). Beside the ones the launcher sets
 * itself (the forwarded signals, CHLD, PIPE), they are the only ones whose disposition an exec does
 * not reset: a caught signal is back at its default in the new program anyway. */
static sigset_t ignored_on_entry;

static void note_ignored_on_entry(void) {
    struct sigaction sa;
    sigemptyset(&ignored_on_entry);
    for (int sig = 1; sig < NSIG; sig++)
        if (sig != SIGKILL && sig != SIGSTOP && sigaction(sig, NULL, &sa) == 0 && sa.sa_handler == SIG_IGN)
            sigaddset(&ignored_on_entry, sig);
}

/* Every signal that could be other than at its default action after the exec back to it: those
 * ignored on entry and those the launcher itself catches or ignores (a per-task sigaction of every
 * signal cost ~60 syscalls a task). glibc refuses its own internal ones, never ignored: EINVAL. */
static void default_all_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    sigset_t reset = ignored_on_entry;
    for (int i = 0; i < N_FORWARDED; i++)
        sigaddset(&reset, FORWARDED[i]);
    sigaddset(&reset, SIGCHLD);
    sigaddset(&reset, SIGPIPE);
    for (int sig = 1; sig < NSIG; sig++)
        if (sig != SIGKILL && sig != SIGSTOP && sigismember(&reset, sig) == 1)
            sigaction(sig, &sa, NULL);
}

/* The child, from the (v)fork to its exec. Everything it does is in this frame and below, never
 * in main's (which the launcher resumes with once the child has exec'd or exited); it writes no
 * memory the launcher reads afterwards (it may share it: vfork, clone3_vm). */
__attribute__((noreturn, noinline)) static void child_after_fork(struct child_args *a) {
    const struct task *t = a->t;
    char **via_sh = a->via_sh;
    const sigset_t *forwarded = a->forwarded;
    if (cg_dir[0] && !a->in_cgroup) {
        int err = cg_enter();
        if (err != 0) {
            /* Never outside its cgroup: a stop would not reach all of it. */
            static const char msg[] = "ql launcher: cannot enter the task's cgroup: ";
            static const char fix[] = "; set [plugin.local] containment = \"process-group\"\n";
            const char *reason = strerror(err);
            if (t->log_fd >= 0)
                dup2(t->log_fd, 2);
            if (write_all(2, msg, sizeof msg - 1) == 0 && write_all(2, reason, strlen(reason)) == 0)
                write_all(2, fix, sizeof fix - 1);
            _exit(126);
        }
    }
    /* CMD starts with every signal at its default, whatever the launcher's host ignored. */
    default_all_signals();
    if (first_pending) {
        /* A signal came first: deliver it to ourselves instead of running CMD. KILL is only a
         * backstop: the disposition is the default and the signal not ignored on entry. */
        int sig = first_pending;
        sigprocmask(SIG_UNBLOCK, forwarded, NULL);
        kill(getpid(), sig);
        kill(getpid(), SIGKILL);
        _exit(LOST);
    }
    /* ... and with none blocked: not the launcher's mask, which its host chose. */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    exec_command(t, via_sh);
    _exit(LOST); /* not reached: exec_command never returns */
}

/* ------------------------------------------------------------------------------------------------
 * Protections (LIMITS), enforced while CMD runs by the one process always there: no host, no
 * supervisor and no reader is needed. The wait sleeps in poll() on descriptors only: a self-pipe
 * (SIGCHLD and forwarded signals), a CLOCK_BOOTTIME timer for the deadline and one for the KILL
 * after a TERM, inotify on the log and a one-shot timer for its size check (both set up only
 * QUOTA_WATCH_AFTER_MS after the go-ahead: one wake-up then). Wake-ups: none while
 * CMD prints nothing and no signal comes, until its deadline; while it writes, at most two a
 * second (the first modification, then the size check QUOTA_CHECK_MS later; further writes are
 * not watched until that check has run). Without inotify (no /proc), the check is a periodic
 * timer: one wake-up a second while a quota is set.
 * ---------------------------------------------------------------------------------------------- */
static int timer_in(int fd, unsigned long long ns, int periodic) {
    struct itimerspec it;
    memset(&it, 0, sizeof it);
    if (ns == 0)
        ns = 1; /* all zero would disarm the timer instead of firing it now */
    it.it_value.tv_sec = (time_t)(ns / 1000000000ULL);
    it.it_value.tv_nsec = (long)(ns % 1000000000ULL);
    if (periodic)
        it.it_interval = it.it_value;
    return timerfd_settime(fd, 0, &it, NULL);
}

/* A relative timer on CLOCK_BOOTTIME (it counts suspend; relative, so no wall-clock step moves it),
 * or CLOCK_MONOTONIC on a kernel without it; -1 when neither can be had. */
static int new_timer(void) {
    int fd = timerfd_create(CLOCK_BOOTTIME, TFD_CLOEXEC | TFD_NONBLOCK);
    return fd >= 0 ? fd : timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
}

static void drain(int fd) {
    char buf[512];
    while (read(fd, buf, sizeof buf) > 0) {
    }
}

/* KILL for CMD and every other member of our process group, but not for us: the launcher must
 * live on to publish the receipt (a group KILL would take it too). The group is ours only when we
 * lead it (ql starts every launcher as a session leader); otherwise CMD alone. A member found is
 * killed; the scan repeats until one finds no member that is still running (a process forked by a
 * member before it died is found next time), at most KILL_SCANS times. */
static void kill_group_but_self(pid_t child) {
    cg_kill(); /* everything of the task, wherever it moved itself */
    kill(child, SIGKILL);
    pid_t me = getpid();
    if (getpgrp() != me)
        return;
    for (int scan = 0; scan < KILL_SCANS; scan++) {
        DIR *proc = opendir("/proc");
        if (proc == NULL)
            return;
        int found = 0;
        struct dirent *entry;
        while ((entry = readdir(proc)) != NULL) {
            char *end, path[64], stat_line[512];
            long pid = strtol(entry->d_name, &end, 10);
            if (*end != '\0' || end == entry->d_name || pid <= 0 || pid == me)
                continue;
            snprintf(path, sizeof path, "/proc/%ld/stat", pid);
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd < 0)
                continue;
            ssize_t n = read_retry(fd, stat_line, sizeof stat_line - 1);
            close(fd);
            if (n <= 0)
                continue;
            stat_line[n] = '\0';
            char *after = strrchr(stat_line, ')'); /* the command name may hold anything */
            char state;
            long ppid, pgrp;
            if (after == NULL || sscanf(after + 1, " %c %ld %ld", &state, &ppid, &pgrp) != 3)
                continue;
            if (pgrp == me && state != 'Z' && state != 'X') {
                kill((pid_t)pid, SIGKILL);
                found = 1;
            }
        }
        closedir(proc);
        if (!found)
            return;
        struct timespec pause = {0, 1000000}; /* 1 ms: let the killed ones become zombies */
        nanosleep(&pause, NULL);
    }
}

struct guard {
    int wake_r, deadline, kill, notify, check;
    int quota_fd, checking, killed;
    unsigned long long quota;
    unsigned long long go_ns;       /* the go-ahead (boot clock) */
    unsigned long long watch_at_ns; /* when the quota watch is due (boot clock); 0: set up, or none */
};

/* The log back to QUOTA + 1 bytes when it is longer. O_APPEND: CMD's next write lands at the new
 * end, so bytes [0, QUOTA] are written once and never touched (docs/logs.md, "Log quota"). */
static void check_quota(const struct guard *g) {
    struct stat st;
    if (fstat(g->quota_fd, &st) == 0 && S_ISREG(st.st_mode) && (unsigned long long)st.st_size > g->quota + 1)
        (void)!ftruncate(g->quota_fd, (off_t)(g->quota + 1));
}

/* The quota's watch: inotify on the log (IN_MODIFY) and the one-shot timer of its size check, or
 * without inotify a periodic check. What CMD wrote before the watch is treated as a first write at
 * the go-ahead (go_ns): checked QUOTA_CHECK_MS after it, as an IN_MODIFY then would have been, never
 * later; further writes are not watched until that check has run. */
static void quota_watch(struct guard *g, unsigned long long go_ns) {
    g->watch_at_ns = 0;
    g->check = new_timer();
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", g->quota_fd);
    g->notify = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    if (g->notify >= 0 && inotify_add_watch(g->notify, path, IN_MODIFY) < 0) {
        close(g->notify);
        g->notify = -1;
    }
    if (g->notify < 0) {
        if (g->check >= 0)
            timer_in(g->check, QUOTA_CHECK_MS * 1000000ULL, 1); /* no inotify: a periodic check */
        return;
    }
    struct stat st;
    if (fstat(g->quota_fd, &st) != 0 || st.st_size == 0)
        return; /* nothing written yet: the first write wakes us, as always */
    unsigned long long now = boot_ns(), due = go_ns + QUOTA_CHECK_MS * 1000000ULL;
    if (g->check >= 0 && timer_in(g->check, now != 0 && due > now ? due - now : 0, 0) == 0)
        g->checking = 1;
    else
        check_quota(g);
}

/* Everything the wait needs, set up before the fork. The quota's watch comes QUOTA_WATCH_AFTER_MS
 * after the go-ahead (most tasks have ended by then and never pay for it); what was written before
 * it is checked QUOTA_CHECK_MS after the go-ahead (quota_watch): no write of CMD goes unseen, and
 * none is cut later than before (QUOTA_CHECK_MS after the first write). */
static void guard_setup(struct guard *g, const struct task *t, int log_fd, unsigned long long go_boot_ns) {
    memset(g, 0, sizeof *g);
    g->wake_r = g->deadline = g->kill = g->notify = g->check = g->quota_fd = -1;
    int wake[2];
    if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) == 0) {
        g->wake_r = wake[0];
        wake_w = wake[1];
    }
    if (t->lim.has_timeout && (g->deadline = new_timer()) >= 0) {
        /* START_BOOT_MS + TIMEOUT_MS on CLOCK_BOOTTIME; without START_BOOT_MS, from the go-ahead
         * (later than the true start: late, never early). */
        unsigned long long now = boot_ns();
        unsigned long long base = t->lim.has_start ? t->lim.start_boot_ms * 1000000ULL : go_boot_ns;
        unsigned long long at = base + t->lim.timeout_ms * 1000000ULL;
        timer_in(g->deadline, now != 0 && at > now ? at - now : 0, 0);
    }
    if (t->lim.has_quota && log_fd >= 0 && (g->quota_fd = fcntl(log_fd, F_DUPFD_CLOEXEC, 3)) >= 0) {
        g->quota = t->lim.quota;
        g->go_ns = go_boot_ns;
        g->watch_at_ns = go_boot_ns + QUOTA_WATCH_AFTER_MS * 1000000ULL;
        if (go_boot_ns == 0)
            quota_watch(g, 0); /* no boot clock to wait on: at once, as always */
    }
}

static void guard_close(struct guard *g) {
    int fds[] = {g->wake_r, wake_w, g->deadline, g->kill, g->notify, g->check, g->quota_fd};
    wake_w = -1;
    for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}


/* Until CMD has exited (not reaped: see main), enforcing the limits. 0, or -1 when its status is
 * gone (never replaced by a made-up code). */
static int guarded_wait(pid_t pid, struct guard *g, const struct task *t) {
    enum { W_WAKE, W_DEADLINE, W_KILL, W_NOTIFY, W_CHECK, W_N };
    for (;;) {
        siginfo_t info;
        memset(&info, 0, sizeof info);
        if (waitid(P_PID, (id_t)pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0) {
            if (info.si_pid == pid)
                return 0;
        } else if (errno != EINTR) {
            return -1;
        }
        if (term_seen && t->lim.has_grace && g->kill < 0 && !g->killed) {
            g->kill = new_timer();
            if (g->kill >= 0)
                timer_in(g->kill, t->lim.grace_ms * 1000000ULL, 0);
        }
        struct pollfd pf[W_N] = {
            [W_WAKE] = {g->wake_r, POLLIN, 0},  [W_DEADLINE] = {g->deadline, POLLIN, 0},
            [W_KILL] = {g->kill, POLLIN, 0},    [W_NOTIFY] = {g->checking ? -1 : g->notify, POLLIN, 0},
            [W_CHECK] = {g->check, POLLIN, 0},
        };
        /* Without a self-pipe, a signal still interrupts poll; the 1 s bound covers the race of a
         * SIGCHLD that lands right before it. A quota watch still to come bounds it too. */
        int timeout = g->wake_r >= 0 ? -1 : 1000;
        if (g->watch_at_ns) {
            unsigned long long now = boot_ns();
            if (now == 0 || now >= g->watch_at_ns) {
                quota_watch(g, g->go_ns);
                continue; /* its descriptors join the poll */
            }
            int ms = (int)((g->watch_at_ns - now + 999999ULL) / 1000000ULL);
            timeout = timeout < 0 || ms < timeout ? ms : timeout;
        }
        int n = poll(pf, W_N, timeout);
        if (n < 0) {
            if (errno != EINTR) {
                struct timespec pause = {0, 100000000}; /* ENOMEM: try again shortly */
                nanosleep(&pause, NULL);
            }
            continue;
        }
        if (pf[W_WAKE].revents)
            drain(g->wake_r);
        if (pf[W_DEADLINE].revents) {
            close(g->deadline);
            g->deadline = -1;
            /* TERM to the group (our own handler forwards it to CMD too and starts the grace). */
            term_seen = 1;
            kill(getpgrp() == getpid() ? -getpid() : pid, SIGTERM);
        }
        if (pf[W_KILL].revents) {
            close(g->kill);
            g->kill = -1;
            g->killed = 1;
            kill_group_but_self(pid);
        }
        if (pf[W_NOTIFY].revents) {
            drain(g->notify);
            if (g->check >= 0 && timer_in(g->check, QUOTA_CHECK_MS * 1000000ULL, 0) == 0)
                g->checking = 1;
            else
                check_quota(g);
        }
        if (pf[W_CHECK].revents) {
            drain(g->check);
            g->checking = 0;
            check_quota(g);
        }
    }
}

/* The acknowledged path's publisher (main, at the end): what it needs, set before it starts. */
static struct {
    struct receipt rec;
    int channel;
    unsigned long long ack_ms;
} pub;
/* The publisher's stack when it is a CLONE_VM child (it shares the launcher's memory): publish()
 * and the wait need a few KiB. */
static unsigned char pub_stack[64 * 1024] __attribute__((aligned(64)));

/* Wait for the host's "ok", else publish the receipt; exits, never returns. The wait is bounded
 * (ACK_WAIT_MS): a host that is frozen (SIGSTOP, a hung disk) must not keep the receipt back for
 * ever. Published after that, it duplicates what the host may still commit, and the consumer
 * discards it. */
__attribute__((noreturn)) static int publisher_main(void *unused) {
    (void)unused;
    char ack[4];
    struct pollfd answer = {pub.channel, POLLIN, 0};
    unsigned long long left_ms = pub.ack_ms;
    unsigned long long until = boot_ns() + left_ms * 1000000ULL;
    int ready;
    for (;;) {
        ready = poll(&answer, 1, left_ms > 0x7fffffffULL ? 0x7fffffff : (int)left_ms);
        if (ready >= 0 || errno != EINTR)
            break;
        unsigned long long now = boot_ns();
        left_ms = now < until ? (until - now) / 1000000ULL : 0;
    }
    if (ready > 0 && read_line(pub.channel, ack, 3) == 2 && ack[0] == 'o' && ack[1] == 'k')
        _exit(0);
    close(pub.channel);
    _exit(publish(&pub.rec));
}

int main(int argc, char **argv) {
    /* Not dumpable: a task of the same user can then neither read this process's memory
     * (/proc/PID/mem, process_vm_readv: the hand-over message and the token are there) nor ptrace
     * it. CMD is exec'd and dumpable again; /proc/PID/stat (identity) stays readable. */
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    const char *cg_parent = getenv("_ql_cgroup"); /* containment: see cg_setup */
    if (argc == 2 && strcmp(argv[1], "--probe") == 0)
        return write_all(1, PROBE_ANSWER, sizeof PROBE_ANSWER - 1) == 0 ? 0 : LOST;
    note_ignored_on_entry(); /* before the launcher changes any disposition itself */
    int factory = argc == 2 && strcmp(argv[1], "--factory") == 0;
    int standby = factory || (argc == 2 && strcmp(argv[1], "--standby") == 0);
    struct task t;
    memset(&t, 0, sizeof t);
    t.log_fd = t.cwd_fd = -1;
    const char *flags = "c"; /* a standby's channel is always on stdin */
    if (!standby) {
        /* LIMITS is optional before "--": without it nothing is enforced (and ACK_WAIT_MS is the
         * default). */
        int dash = argc >= 9 && strcmp(argv[7], "--") == 0 ? 7 : argc >= 10 && strcmp(argv[8], "--") == 0 ? 8 : 0;
        if (dash == 0)
            return LOST;
        t.lim.ack_ms = ACK_WAIT_MS_DEFAULT;
        if (dash == 8 && !parse_limits(argv[7], &t.lim))
            return LOST;
        t.rec = (struct receipt){.shard = argv[1], .run = argv[2], .attempt = argv[3], .seq = argv[4]};
        if (!valid_ids(&t.rec, argv[5]) || !parse_mode(argv[6], argc - dash - 1, argv + dash + 1, &t))
            return LOST;
        flags = strchr(argv[6], '+') ? strchr(argv[6], '+') + 1 : "";
    }

    /* What a shell would not let CMD inherit: an ignored SIGCHLD (the kernel would reap CMD
     * itself and its status would be lost) and blocked forwarded signals. */
    signal(SIGCHLD, SIG_DFL);
    sigset_t forwarded, saved_mask;
    sigemptyset(&forwarded);
    for (int i = 0; i < N_FORWARDED; i++)
        sigaddset(&forwarded, FORWARDED[i]);
    sigset_t unblock = forwarded;
    sigaddset(&unblock, SIGCHLD);
    sigprocmask(SIG_UNBLOCK, &unblock, NULL);

    /* The channel: on stdin with flag c (stdin becomes /dev/null), else on fd 3. Never inherited
     * by CMD or the publisher's tools. */
    int channel = 3;
    if (strchr(flags, 'c')) {
        channel = fcntl(0, F_DUPFD_CLOEXEC, 3);
        int null_fd = open("/dev/null", O_RDONLY);
        if (channel < 0 || null_fd < 0 || dup2(null_fd, 0) < 0)
            return LOST;
        if (null_fd != 0)
            close(null_fd);
    } else if (fcntl(channel, F_SETFD, FD_CLOEXEC) < 0) {
        channel = -1; /* closed: no token can come */
    }
    if (standby) {
        close_from_3_except(channel);
        /* A standby may wait long and its command may run for days: it must not pin the directory
         * its host happened to be in (an unmount would fail). CMD gets its own from the message. */
        if (chdir("/") != 0) {
            /* nothing depends on it: every path the launcher itself uses is absolute */
        }
    } else {
        cloexec_from_3();
    }

    /* Signals may arrive before the child exists; they are remembered and re-delivered by it. A
     * standby is different until its run arrives: a signal then ends it (125, nothing run, no
     * receipt) — a stray TERM to an idle standby must not become the next run's 143, and a cancel
     * that reaches it after its run's create commit ends that run through the host (cancelled). */
    idle_standby = standby;
    set_forwarded(on_signal, standby);
    if (factory)
        channel = serve_standbys(channel, argv); /* from here on: a standby it forked */

    /* The go-ahead: the host sends it only after it has committed this launcher's durable handle.
     * EOF or anything invalid: exit 125, nothing run, no receipt. */
    char token[TOKEN_MAX + 2];
    if (standby) {
        if (!receive_spec(channel, &t))
            return LOST;
        idle_standby = 0; /* from here on it holds a run: signals are remembered, as above */
        /* A standby's own environment is empty: the host names the parent cgroup in the run's
         * (dropped from CMD's with every _ql_ name). */
        for (char **e = t.envp; e != NULL && *e != NULL; e++)
            if (strncmp(*e, "_ql_cgroup=", 11) == 0)
                cg_parent = *e + 11;
        set_forwarded(on_signal, 0); /* and forwarded, even those its host ignored */
    } else {
        int len = channel >= 0 ? read_line(channel, token, TOKEN_MAX + 1) : -1;
        if (len < 0 || !valid_token(token, (size_t)len))
            return LOST;
        t.rec.token = token;
    }
    if (!t.awaited) {
        close(channel);
        channel = -1;
    }
    cg_setup(cg_parent, t.rec.attempt); /* the attempt id is a checked uuid */

    unsigned long long go_boot_ns = boot_ns();
    struct guard guard;
    guard_setup(&guard, &t, standby ? t.log_fd : 1, go_boot_ns);
    struct sigaction on_chld;
    memset(&on_chld, 0, sizeof on_chld);
    on_chld.sa_handler = on_child;
    on_chld.sa_flags = SA_NOCLDSTOP;
    sigemptyset(&on_chld.sa_mask);
    sigaction(SIGCHLD, &on_chld, NULL); /* wakes the wait; CMD gets the default back */

    char **via_sh = shell_fallback(t.cmd);
    sigprocmask(SIG_BLOCK, &forwarded, &saved_mask);
    /* vfork: the command's exec is on the critical path of every task, and copying even this small
     * process's page tables for a child that execs at once costs ~50 us. The launcher is single-
     * threaded and waits suspended until the child has exec'd or exited. */
    struct child_args child = {&t, via_sh, &forwarded, 0, 0};
    while (t.cmd[child.words] != NULL && child.words <= CLONE_VM_MAX_ARGS)
        child.words++;
    pid_t pid = cg_dir[0] ? fork_into_cgroup(&child) : -1;
    if (pid == -1)
        pid = vfork(); /* no containment, or no clone3 here: the child moves itself (cg_enter) */
    if (pid == 0)
        child_after_fork(&child);
    if (pid < 0)
        return LOST; /* CMD never ran, and nothing claims otherwise */
    if (!in_spare(via_sh))
        free(via_sh);
    child_pid = pid;
    /* From here on the launcher holds the log open only to enforce its quota (a duplicate it
     * never writes to): only CMD writes to it. */
    if (standby) {
        close(t.log_fd);
        close(t.cwd_fd);
    } else {
        int null_fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
        if (null_fd >= 0) {
            dup2(null_fd, 1);
            dup2(null_fd, 2);
            close(null_fd);
        }
    }
    sigprocmask(SIG_SETMASK, &saved_mask, NULL); /* what came during the fork is forwarded now */

    /* Wait without reaping, so that no signal is ever forwarded to a pid that was reused: the
     * forwarding stops (blocked, then ignored) before the zombie is reaped. */
    if (guarded_wait(pid, &guard, &t) != 0)
        return LOST; /* the status is gone: never replaced by a made-up code */
    sigprocmask(SIG_BLOCK, &forwarded, NULL);
    child_pid = 0;
    /* Nothing is left to forward to; publication cannot be cut short by a group signal. */
    set_forwarded(SIG_IGN, 0);
    sigprocmask(SIG_SETMASK, &saved_mask, NULL);
    int wstatus;
    for (;;) {
        pid_t got = waitpid(pid, &wstatus, 0);
        if (got == pid)
            break;
        if (got < 0 && errno != EINTR)
            return LOST;
    }
    struct receipt rec = t.rec;
    rec.finished = finished_at(&t);
    /* A stopped task (a cancel's or the deadline's TERM came) whose command has ended: what it left
     * running (moved out of the group, double-forked) is killed with it; then its cgroup goes. */
    if (term_seen)
        cg_kill();
    cg_remove();
    /* A last look at the log: what CMD wrote in its final second is cut too. */
    if (guard.quota_fd >= 0)
        check_quota(&guard);
    guard_close(&guard);
    if (WIFEXITED(wstatus))
        rec.status = WEXITSTATUS(wstatus);
    else if (WIFSIGNALED(wstatus))
        rec.status = 128 + WTERMSIG(wstatus);
    else
        return LOST;

    /* Acknowledged completion (launcher.sh, "The acknowledged path"): "s" says our exit status is
     * CMD's; a publisher left behind publishes the receipt unless the host answers "ok". */
    if (t.awaited) {
        signal(SIGPIPE, SIG_IGN);
        if (write_all(channel, "s", 1) == 0) {
            pub.rec = rec;
            pub.channel = channel;
            pub.ack_ms = t.lim.ack_ms;
            /* CLONE_VM: the publisher lives on the launcher's memory (which it keeps alive once the
             * launcher has exited), so the kernel neither copies the page tables nor tears down a
             * second copy: ~0.05 ms less CPU per task than a fork (bench/bench_edge.py
             * --cpu-only). The launcher touches nothing after it: it exits at once, without
             * running anything of libc's exit. A fork where clone is refused. */
            pid_t publisher = clone(publisher_main, pub_stack + sizeof pub_stack, CLONE_VM | SIGCHLD, NULL);
            if (publisher > 0)
                _exit(rec.status);
            publisher = fork();
            if (publisher == 0)
                publisher_main(NULL);
            if (publisher > 0)
                return rec.status;
            /* No publisher: the receipt is published now (a later commit of the same status by
             * the host makes it a duplicate, which the consumer discards). */
        }
        close(channel);
    }
    publish(&rec);
    return rec.status;
}
