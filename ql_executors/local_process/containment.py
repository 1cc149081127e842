"""Task containment: each task in its own cgroup v2 where one can be made, else its process group.

With cgroup v2 mounted and a parent cgroup this host may write (delegated to its user, or root),
every task runs in ``<parent>/<attempt id>``: the launcher's child creates that cgroup and moves
itself into it before it runs any user code, and the KILL of a stop (the grace after a cancel's or
a deadline's TERM; what a stopped task left behind) is ``cgroup.kill`` of it, which reaches every
process the task started — one that called ``setsid``, a double-forked grandchild — while the
launcher itself, outside that cgroup, lives on to publish the receipt. Names carry the attempt id
only (a uuid), never anything of the command. Elsewhere: the process group, as before.

The parent is ``<this process's own cgroup>/ql-<uid>`` unless ``[plugin.local] cgroup_parent``
names one; ``[plugin.local] containment = "process-group"`` switches cgroups off. Empty task cgroups
are removed by their launcher when the run ends, and by :func:`sweep` (bounded) for any left
behind (a crash, or a task that left processes running after it exited normally).
"""

from __future__ import annotations

import os
import re

from ql_core.value_class import value_class

from .settings import CONTAINMENT_CHOICES  # auto: cgroup v2 where usable; process-group: never a cgroup

__all__ = ["CONTAINMENT_CHOICES", "CGROUP_ENV", "Containment", "find_containment", "group_cgroups", "kill_cgroup",
           "sweep", "SWEEP_MAX", "SWEEP_SCAN"]

#: The launcher's environment variable naming the parent cgroup directory (never reaches the task:
#: both launchers drop their ``_ql_`` names).
CGROUP_ENV = "_ql_cgroup"
#: At most this many task cgroups are looked at by one :func:`sweep`.
SWEEP_MAX = 256
#: At most this many entries of the parent are read by one :func:`sweep` (its window of
#: :data:`SWEEP_MAX` is drawn among them).
SWEEP_SCAN = 4096
#: A longer parent path is not used (it travels in the launcher's environment and is joined with
#: an attempt id and a file name by the launcher, in fixed buffers).
_PATH_MAX = 3000
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@value_class()  # as @dataclass(frozen=True), without its import-time code generation
class Containment:
    """What contains this host's tasks: ``parent`` (a cgroup directory) or None with the ``reason``
    the process group is used instead."""

    __slots__ = ("parent", "reason")
    parent: str | None
    reason: str

    def __init__(self, parent: str | None, reason: str) -> None:
        object.__setattr__(self, "parent", parent)
        object.__setattr__(self, "reason", reason)

    @property
    def kind(self) -> str:
        return "cgroup" if self.parent is not None else "process-group"

    def describe(self) -> str:
        if self.parent is not None:
            return f"cgroup v2 ({self.parent})"
        return f"process group ({self.reason})"


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as ``\\ooo``."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _cgroup2_mount() -> tuple[str, str] | None:
    """``(mount point, root within the hierarchy)`` of the first cgroup2 mount, or None."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        left, sep, right = line.partition(" - ")
        if not sep or right.split(" ", 1)[0] != "cgroup2":
            continue
        fields = left.split(" ")
        if len(fields) >= 5:
            return _unescape(fields[4]), _unescape(fields[3])
    return None


def _own_cgroup() -> str | None:
    """This process's cgroup v2 path (``0::PATH`` of /proc/self/cgroup), or None."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8", errors="surrogateescape") as f:
            for line in f.read().splitlines():
                if line.startswith("0::"):
                    path = line[3:]
                    return path if path.startswith("/") and not path.endswith(" (deleted)") else None
    except OSError:
        return None
    return None


def _default_parent() -> tuple[str | None, str]:
    mount = _cgroup2_mount()
    if mount is None:
        return None, "no cgroup2 mount"
    point, root = mount
    own = _own_cgroup()
    if own is None:
        return None, "this process has no cgroup v2 path"
    if root != "/":
        if own != root and not own.startswith(root.rstrip("/") + "/"):
            return None, "this process's cgroup is outside the cgroup2 mount"
        own = own[len(root.rstrip("/")):] or "/"
    own_dir = os.path.join(point, own.lstrip("/")).rstrip("/") or "/"
    # Moving a process needs write access to cgroup.procs of the common ancestor of its old and new
    # cgroup: the launcher's (this process's) own cgroup, which holds the parent.
    if not os.access(os.path.join(own_dir, "cgroup.procs"), os.W_OK):
        return None, f"not writable: {own_dir}/cgroup.procs (cgroup not delegated to uid {os.geteuid()})"
    return os.path.join(own_dir, f"ql-{os.geteuid()}"), ""


def find_containment(choice: str = "auto", cgroup_parent: str | None = None, *, create: bool = True) -> Containment:
    """The containment this host's tasks get. ``create``: make the parent directory when missing
    (doctor passes False and only says whether it could)."""
    if choice == "process-group":
        return Containment(None, '[plugin.local] containment = "process-group"')
    if not os.path.isdir("/proc/self"):
        return Containment(None, "no /proc (not Linux)")
    if cgroup_parent is not None:
        parent = cgroup_parent
        if not os.path.isabs(parent):
            return Containment(None, "[plugin.local] cgroup_parent is not an absolute path")
    else:
        found, reason = _default_parent()
        if found is None:
            return Containment(None, reason)
        parent = found
    parent = os.path.normpath(parent)
    if len(os.fsencode(parent)) > _PATH_MAX:
        return Containment(None, "the cgroup parent path is too long")
    if not os.path.isdir(parent):
        holder = os.path.dirname(parent)
        if not os.path.exists(os.path.join(holder, "cgroup.procs")):
            return Containment(None, f"not a cgroup v2 directory: {holder}")
        if not create:
            if not os.access(holder, os.W_OK):
                return Containment(None, f"not writable: {holder}")
            if not os.path.exists(os.path.join(holder, "cgroup.kill")) and holder != _mount_point():
                return Containment(None, "kernel without cgroup.kill (Linux < 5.14)")
            return Containment(parent, "")
        try:
            os.mkdir(parent, 0o755)
        except FileExistsError:
            pass
        except OSError as exc:
            return Containment(None, f"not writable: {holder} ({exc.strerror})")
    if not os.path.exists(os.path.join(parent, "cgroup.procs")):
        return Containment(None, f"not a cgroup v2 directory: {parent}")
    if not os.path.exists(os.path.join(parent, "cgroup.kill")):
        return Containment(None, "kernel without cgroup.kill (Linux < 5.14)")
    if not os.access(parent, os.W_OK | os.X_OK):
        return Containment(None, f"not writable: {parent}")
    return Containment(parent, "")


def _mount_point() -> str | None:
    mount = _cgroup2_mount()
    return mount[0] if mount is not None else None


def sweep(parent: str, *, limit: int = SWEEP_MAX, scan: int = SWEEP_SCAN) -> int:
    """Remove up to ``limit`` empty task cgroups below ``parent`` (named by an attempt id; one with
    processes refuses ``rmdir``, so a running task's is never touched). A launcher whose cgroup is
    removed between its creation and its entry creates it again. The number removed.

    The ``limit`` tried are a window at a random place among the first ``scan`` task cgroups the
    directory lists: with more than ``limit`` running tasks, a fixed window (the listing's order
    is stable) would try the same busy ones every time and never reach a crashed run's leftover."""
    names: list[str] = []
    try:
        with os.scandir(parent) as entries:
            for entry in entries:
                if _UUID.match(entry.name):
                    names.append(entry.name)
                    if len(names) >= scan:
                        break
    except OSError:
        return 0
    if len(names) > limit:
        start = int.from_bytes(os.urandom(4), "little") % len(names)  # not `random`: an import per ql run
        names = (names[start:] + names[:start])[:limit]
    removed = 0
    for name in names:
        try:
            os.rmdir(os.path.join(parent, name))
        except OSError:
            continue
        removed += 1
    return removed


def _cgroup_dir_of(pid: int) -> str | None:
    """The cgroup v2 directory of ``pid`` (as this process's namespace sees it), or None."""
    mount = _cgroup2_mount()
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    if mount is None:
        return None
    point, root = mount
    for line in lines:
        if line.startswith("0::/"):
            path = line[3:]
            if root != "/":
                if not path.startswith(root.rstrip("/") + "/"):
                    return None
                path = path[len(root.rstrip("/")):]
            return os.path.join(point, path.lstrip("/"))
    return None


def group_cgroups(parent: str, pgid: int, *, limit: int = 4096) -> list[str]:
    """The task cgroups below ``parent`` that live members of process group ``pgid`` are in (the
    task of a launcher that was killed on its own: its command still runs in the launcher's group).
    Looked at in at most ``limit`` processes of /proc."""
    found: list[str] = []
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()][:limit]
    except OSError:
        return found
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        fields = raw[raw.rfind(b")") + 1:].split()
        if len(fields) < 3 or fields[0] in (b"Z", b"X") or fields[2] != str(pgid).encode():
            continue
        where = _cgroup_dir_of(int(entry))
        if (where is not None and os.path.dirname(where) == parent and _UUID.match(os.path.basename(where))
                and where not in found):
            found.append(where)
    return found


def kill_cgroup(path: str) -> bool:
    """KILL every process of the task cgroup ``path`` (``cgroup.kill``); False when it is gone."""
    try:
        fd = os.open(os.path.join(path, "cgroup.kill"), os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        os.write(fd, b"1")
    except OSError:
        return False
    finally:
        os.close(fd)
    return True
