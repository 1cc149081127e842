/*
 * ql compiled launcher: the contract of launcher.sh, as one small C program.
 *
 *   ql-launcher SHARD_DIR RUN_ID ATTEMPT_ID CALLBACK_SEQUENCE STARTED_AT_MS MODE -- CMD [ARG...]
 *
 * Same arguments, channel, exit statuses and receipt bytes as launcher.sh (read its header and
 * docs/launcher.md first); ql builds this file once per machine when a C compiler is available
 * (ql_executors/local_process/compiled.py) and falls back to launcher.sh otherwise. What differs:
 *
 * - No helper processes: signals are reset to their defaults in the child before exec (what
 *   `env --default-signal` does for the shell), the status comes from waitpid on our own child
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
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
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
/* How long an awaited task's publisher waits for its host's "ok" before it publishes anyway. */
#define ACK_WAIT_MS 10000

static const int FORWARDED[] = {SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};
#define N_FORWARDED ((int)(sizeof FORWARDED / sizeof FORWARDED[0]))

static volatile sig_atomic_t child_pid;     /* > 0 once CMD's process exists */
static volatile sig_atomic_t first_pending; /* the first signal caught before that */
static volatile sig_atomic_t idle_standby;  /* a standby that has no run yet */

static void on_signal(int sig) {
    int saved = errno;
    pid_t child = (pid_t)child_pid;
    if (idle_standby)
        _exit(LOST); /* nothing of a run is here: a signal ends the standby, never a later run */
    if (child > 0)
        kill(child, sig);
    else if (!first_pending)
        first_pending = sig;
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

static void set_forwarded(void (*handler)(int), int skip_ignored) {
    for (int i = 0; i < N_FORWARDED; i++) {
        struct sigaction sa;
        if (skip_ignored && sigaction(FORWARDED[i], NULL, &sa) == 0 && sa.sa_handler == SIG_IGN)
            continue; /* inherited as ignored (nohup): stays ignored, as in a shell */
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

/* What `ql-launcher --probe` prints: ql checks a build by its output, not by an exit status (a
 * host that ignores SIGCHLD gets no exit status from any child). */
static const char PROBE_ANSWER[] = "ql-launcher ok\n";

/* One run, however it reached us: from argv and the token line, or from a standby's spec. */
struct task {
    struct receipt rec;
    char **cmd;       /* CMD ARG... (shell mode: /bin/sh -c WORD) */
    char **envp;      /* standby: CMD's environment; argv mode: NULL (ours, as inherited) */
    const char *cwd;  /* standby: "" = the host's directory (cwd_fd), else relative to it */
    int log_fd;       /* standby: the log artifact (CMD's stdout/stderr); -1 in argv mode */
    int cwd_fd;       /* standby: the host's working directory at hand-over; -1 in argv mode */
    int awaited;
};

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
 *   "ql-standby-1" SHARD_DIR RUN_ID ATTEMPT_ID CALLBACK_SEQUENCE STARTED_AT_MS MODE CWD
 *   ARGC ARG... ENVC NAME=VALUE... TOKEN
 *
 * with exactly two descriptors (SCM_RIGHTS): the log artifact, and the host's working directory
 * (CMD runs there, or in CWD relative to it). Nothing of it ever appears in our argv or environment.
 * ---------------------------------------------------------------------------------------------- */
#define SPEC_MAX (192 * 1024) /* ql_executors/local_process/launch.py STANDBY_SPEC_MAX */
#define SPEC_FDS 2
static char spec[SPEC_MAX + 1];

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
    char **words = calloc((size_t)n + 1, sizeof *words);
    if (words == NULL)
        return NULL;
    for (unsigned long long i = 0; i < n; i++) {
        const char *w = next_field(p, end);
        if (w == NULL) {
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

/* An idle standby waits for its message on the channel AND for its owner's death. EOF on the
 * channel is not enough: a host that forked through libc (no after-fork hook ran) left a copy of
 * its end in the child, and that copy keeps the channel open after the host itself died. The owner
 * is the process that created the socket pair (SO_PEERCRED: nothing to pass, nothing in argv);
 * while it is our parent, a changed parent (we were reparented: it died) says it is gone — no pid
 * is ever compared after it could have been reused. Started through an intermediary (a tracer, say),
 * the owner's pid is asked instead. No descriptor is held for it: an idle standby holds nothing but
 * its channel. 1: the channel has something (a message, or EOF); 0: the owner is gone. */
static int wait_for_message(int channel) {
    struct ucred owner;
    socklen_t len = sizeof owner;
    if (getsockopt(channel, SOL_SOCKET, SO_PEERCRED, &owner, &len) != 0 || len != sizeof owner || owner.pid <= 0)
        owner.pid = 0; /* not a socket pair we can ask: EOF alone decides, as before */
    int parent = owner.pid > 0 && getppid() == owner.pid;
    struct pollfd fd = {.fd = channel, .events = POLLIN};
    for (;;) {
        if (owner.pid > 0 && (parent ? getppid() != owner.pid : kill(owner.pid, 0) != 0 && errno == ESRCH))
            return 0;
        int r = poll(&fd, 1, owner.pid > 0 ? OWNER_CHECK_MS : -1);
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
    char *p = spec;
    const char *end = spec + (ok ? n : 0);
    const char *magic = next_field(&p, end);
    const char *mode = NULL, *started = NULL, *argc_s = NULL, *envc_s = NULL, *token = NULL;
    unsigned long long n_args = 0, n_env = 0;
    char **args = NULL;
    if (ok && magic != NULL && strcmp(magic, "ql-standby-1") == 0) {
        t->rec.shard = next_field(&p, end);
        t->rec.run = next_field(&p, end);
        t->rec.attempt = next_field(&p, end);
        t->rec.seq = next_field(&p, end);
        started = next_field(&p, end);
        mode = next_field(&p, end);
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

/* The fallback for an executable file without #!: it runs as a shell script, as under launcher.sh
 * (glibc's execvp does this itself; musl's does not): `sh -c 'exec "$0" "$@"' CMD ARG...`. Built
 * before the fork: the child of a vfork must not allocate. */
__attribute__((noinline)) static char **shell_fallback(char **cmd) {
    int n = 0;
    while (cmd[n])
        n++;
    char **via_sh = calloc((size_t)n + 4, sizeof *via_sh);
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

/* The child, from the vfork to its exec. Everything it does is in this frame and below, never in
 * main's (which the launcher resumes with once the child has exec'd or exited). */
__attribute__((noreturn, noinline)) static void child_after_fork(const struct task *t, char **via_sh,
                                                                  const sigset_t *forwarded,
                                                                  const sigset_t *saved_mask) {
    /* CMD starts with default dispositions for every forwarded signal. */
    set_forwarded(SIG_DFL, 0);
    if (first_pending) {
        /* A signal came first: deliver it to ourselves instead of running CMD. KILL is only a
         * backstop: the disposition is the default and the signal not ignored on entry. */
        int sig = first_pending;
        sigprocmask(SIG_UNBLOCK, forwarded, NULL);
        kill(getpid(), sig);
        kill(getpid(), SIGKILL);
        _exit(LOST);
    }
    sigprocmask(SIG_SETMASK, saved_mask, NULL);
    exec_command(t, via_sh);
    _exit(LOST); /* not reached: exec_command never returns */
}

int main(int argc, char **argv) {
    /* Not dumpable: a task of the same user can then neither read this process's memory
     * (/proc/PID/mem, process_vm_readv: the hand-over message and the token are there) nor ptrace
     * it. CMD is exec'd and dumpable again; /proc/PID/stat (identity) stays readable. */
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    if (argc == 2 && strcmp(argv[1], "--probe") == 0)
        return write_all(1, PROBE_ANSWER, sizeof PROBE_ANSWER - 1) == 0 ? 0 : LOST;
    int standby = argc == 2 && strcmp(argv[1], "--standby") == 0;
    struct task t;
    memset(&t, 0, sizeof t);
    t.log_fd = t.cwd_fd = -1;
    const char *flags = "c"; /* a standby's channel is always on stdin */
    if (!standby) {
        if (argc < 9 || strcmp(argv[7], "--") != 0)
            return LOST;
        t.rec = (struct receipt){.shard = argv[1], .run = argv[2], .attempt = argv[3], .seq = argv[4]};
        if (!valid_ids(&t.rec, argv[5]) || !parse_mode(argv[6], argc - 8, argv + 8, &t))
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
    set_forwarded(on_signal, 1);

    /* The go-ahead: the host sends it only after it has committed this launcher's durable handle.
     * EOF or anything invalid: exit 125, nothing run, no receipt. */
    char token[TOKEN_MAX + 2];
    if (standby) {
        if (!receive_spec(channel, &t))
            return LOST;
        idle_standby = 0; /* from here on it holds a run: signals are remembered, as above */
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

    char **via_sh = shell_fallback(t.cmd);
    sigprocmask(SIG_BLOCK, &forwarded, &saved_mask);
    /* vfork: the command's exec is on the critical path of every task, and copying even this small
     * process's page tables for a child that execs at once costs ~50 us. The launcher is single-
     * threaded and waits suspended until the child has exec'd or exited. */
    pid_t pid = vfork();
    if (pid == 0)
        child_after_fork(&t, via_sh, &forwarded, &saved_mask);
    if (pid < 0)
        return LOST; /* CMD never ran, and nothing claims otherwise */
    free(via_sh);
    child_pid = pid;
    /* From here on the launcher no longer holds the log open: only CMD writes to it. */
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
    for (;;) {
        siginfo_t info;
        memset(&info, 0, sizeof info);
        if (waitid(P_PID, (id_t)pid, &info, WEXITED | WNOWAIT) == 0)
            break;
        if (errno != EINTR)
            return LOST; /* the status is gone: never replaced by a made-up code */
    }
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
    rec.finished = finished_now();
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
            pid_t publisher = fork();
            if (publisher == 0) {
                char ack[4];
                /* Bounded (ACK_WAIT_MS): a stopped host, or a copy of its end kept by a child it
                 * forked, must not hold the receipt back for ever. */
                struct pollfd ack_fd = {.fd = channel, .events = POLLIN};
                int ready;
                do
                    ready = poll(&ack_fd, 1, ACK_WAIT_MS);
                while (ready < 0 && errno == EINTR);
                if (ready > 0 && read_line(channel, ack, 3) == 2 && ack[0] == 'o' && ack[1] == 'k')
                    _exit(0);
                close(channel);
                _exit(publish(&rec));
            }
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
