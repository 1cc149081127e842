"""Sealed task specs: a run's command, cwd and environment cross the control database only as
AES-256-GCM ciphertext (``cryptography``'s AESGCM).

Who holds what
    The *key* is a 32-byte file on the submitting control nodes and on the workers
    (``[plugin.cluster-fenced] spec_key_file``), never in the database. The database stores the
    ciphertext and the key id; only ``ql_claim`` hands a copy out, to the worker whose claim just
    created the lease, and the worker opens it in memory right before spawning.

Associated data: the run and its attempt
    The submitter seals when the run is queued, but the attempt id (a UUID) is chosen later by
    the claiming worker, so it cannot be in a ciphertext made at submit time. What *is* known at
    submit time is the attempt's ordinal in the run's retry policy: the n-th attempt that may
    start (1 ≤ n ≤ ``max_attempts``). So the submitter seals ONE copy per allowed attempt, with
    ``ql-spec-v1 ‖ run id ‖ n ‖ key id`` as associated data; ``ql_claim`` hands out copy n to the
    n-th attempt (attempts that provably never started do not count, exactly as for retries) and
    that copy is erased when the attempt ends (the run's last copies when the run ends). A copy
    moved to another run or another ordinal fails authentication: the worker refuses it and the
    attempt ends ``lost`` with reason ``SPEC_UNREADABLE`` — a clear failure, never a wrong command.

Key ids and rotation
    The key id is the first 8 bytes (hex) of SHA-256("ql-spec-key-id" ‖ key): it names the key
    without revealing anything usable about it. A :class:`SpecKeyRing` seals with its current key
    and opens with the current or the ``spec_previous_key_file`` key (rotation: give the workers
    the new key as current and the old one as previous, then the submitters the new key; once no
    queued run was sealed with the old key, drop it).

Key files are read like every secret file of ql: opened without blocking (a FIFO cannot hang us),
a regular file, owned by the running user, mode 0600 (no group/other bits), exactly 32 bytes.
Every refusal is one line naming the file and the fix — never the key's bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ql_core.errors import ConfigError

__all__ = [
    "KEY_BYTES",
    "MAX_SPEC_BYTES",
    "SealedCopy",
    "SealedSpec",
    "SpecKey",
    "SpecKeyRing",
    "SpecUnreadable",
    "encode_spec",
    "key_id_of",
    "load_key_file",
    "new_key_file",
]

#: AES-256: the key file holds exactly this many random bytes.
KEY_BYTES = 32
#: A spec (JSON of command, shell, cwd, env) larger than this is refused at submit time.
MAX_SPEC_BYTES = 128 * 1024
_NONCE_BYTES = 12
_AD_PREFIX = b"ql-spec-v1\0"
_KEY_ID_PREFIX = b"ql-spec-key-id\0"


class SpecUnreadable(Exception):
    """A sealed copy that this worker cannot open (unknown key id, or it fails authentication).
    The message names the key id only."""


def key_id_of(key: bytes) -> str:
    """The key's public name: 16 hex digits of a domain-separated SHA-256 of it."""
    return hashlib.sha256(_KEY_ID_PREFIX + key).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class SpecKey:
    key_id: str
    key: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class SealedCopy:
    """One attempt's sealed spec as ``ql_claim`` returned it (nonce ‖ ciphertext ‖ tag)."""

    key_id: str
    ordinal: int
    blob: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class SealedSpec:
    """What ``ql_submit`` stores: one copy per allowed attempt (ordinal = index + 1)."""

    key_id: str
    copies: tuple[bytes, ...] = field(repr=False)


def _ad(run_id: str, ordinal: int, key_id: str) -> bytes:
    return _AD_PREFIX + f"{run_id}\0{int(ordinal)}\0{key_id}".encode()


def _check_key_file(path: Path, st: os.stat_result, setting: str) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{setting} {path} is not a regular file; point it at a key file made by "
                          f"`ql db new-spec-key PATH`")
    if st.st_uid != os.geteuid():
        raise ConfigError(f"{setting} {path} is not owned by the user running ql (uid {os.geteuid()}); "
                          f"chown it to that user")
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise ConfigError(f"{setting} {path} is readable by others (mode {stat.S_IMODE(st.st_mode):o}): "
                          f"chmod 600 {path}")
    if st.st_size != KEY_BYTES:
        raise ConfigError(f"{setting} {path} must hold exactly {KEY_BYTES} random bytes, it has {st.st_size}; "
                          f"create one with `ql db new-spec-key PATH` (or head -c 32 /dev/urandom > PATH)")


def load_key_file(path: str | os.PathLike[str], *, setting: str = "spec_key_file") -> SpecKey:
    """Read one key file (non-blocking open, checked, bounded read). ConfigError otherwise."""
    path = Path(path)
    if not path.is_absolute():
        raise ConfigError(f"{setting} must be an absolute path, got a relative one; e.g. "
                          f'{setting} = "/etc/ql/spec.key"')
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        raise ConfigError(f"{setting} {path} does not exist; create it with `ql db new-spec-key {path}` "
                          f"and copy it to every control node and worker") from None
    except OSError as exc:
        raise ConfigError(f"{setting} {path} cannot be opened ({exc.strerror or type(exc).__name__}); "
                          f"fix its permissions (owner = the user running ql, mode 600)") from None
    try:
        _check_key_file(path, os.fstat(fd), setting)
        key = os.read(fd, KEY_BYTES + 1)  # bounded: one byte more reveals a file that grew
    except OSError as exc:
        raise ConfigError(f"{setting} {path} cannot be read ({exc.strerror or type(exc).__name__})") from None
    finally:
        os.close(fd)
    if len(key) != KEY_BYTES:
        raise ConfigError(f"{setting} {path} changed while being read; it must hold exactly {KEY_BYTES} bytes")
    return SpecKey(key_id_of(key), key)


def new_key_file(path: str | os.PathLike[str]) -> str:
    """Create ``path`` (0600, never replacing a file) with 32 random bytes; returns the key id."""
    path = Path(path)
    key = os.urandom(KEY_BYTES)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        raise ConfigError(f"{path} already exists; ql never replaces a key file (rotate: create a new one "
                          f"elsewhere, see docs/cluster.md)") from None
    except OSError as exc:
        raise ConfigError(f"cannot create {path} ({exc.strerror or type(exc).__name__})") from None
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        view = memoryview(key)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except OSError as exc:
        os.close(fd)
        os.unlink(path)
        raise ConfigError(f"cannot write {path} ({exc.strerror or type(exc).__name__})") from None
    os.close(fd)
    return key_id_of(key)


def encode_spec(command: Any, shell: bool, cwd: str | None, env: Mapping[str, str] | None,
                env_add: Mapping[str, str] | None = None) -> bytes:
    """The spec's plain JSON: ``env`` the task's whole environment ({}: the worker's own), ``env_add``
    (only when given: ``ql run --env``) what the worker adds to it."""
    spec: dict[str, Any] = {"command": list(command), "shell": bool(shell), "cwd": cwd, "env": dict(env or {})}
    if env_add:
        spec["env_add"] = dict(env_add)
    return json.dumps(spec, separators=(",", ":"), ensure_ascii=False).encode()


class SpecKeyRing:
    """The current key (seals, opens) and an optional previous key (opens only, for rotation)."""

    def __init__(self, current: SpecKey, previous: SpecKey | None = None) -> None:
        self.current = current
        self.previous = previous if previous is not None and previous.key_id != current.key_id else None

    @classmethod
    def from_settings(cls, key_file: str | None, previous_file: str | None) -> SpecKeyRing:
        if not key_file:
            raise ConfigError('cluster runs are sealed and no key is configured: set [plugin.cluster-fenced] '
                              'spec_key_file = "/etc/ql/spec.key" (create it with `ql db new-spec-key PATH`), '
                              'the same key on the control nodes and the workers')
        current = load_key_file(key_file)
        previous = load_key_file(previous_file, setting="spec_previous_key_file") if previous_file else None
        return cls(current, previous)

    def seal(self, run_id: str, spec: bytes, max_attempts: int) -> SealedSpec:
        """One copy per allowed attempt, each bound to (run id, ordinal, key id)."""
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        if len(spec) > MAX_SPEC_BYTES:
            raise ConfigError(f"the task's command, cwd and environment take {len(spec)} bytes, more than the "
                              f"{MAX_SPEC_BYTES} a cluster run may have; pass large data in a file instead")
        aead = AESGCM(self.current.key)
        copies = []
        for ordinal in range(1, int(max_attempts) + 1):
            nonce = os.urandom(_NONCE_BYTES)  # random 96-bit nonces: far below the 2^32 messages bound
            copies.append(nonce + aead.encrypt(nonce, spec, _ad(run_id, ordinal, self.current.key_id)))
        return SealedSpec(self.current.key_id, tuple(copies))

    def open(self, run_id: str, copy: SealedCopy) -> dict[str, Any]:
        """The spec of attempt ``copy.ordinal`` of ``run_id``, in memory only; SpecUnreadable otherwise."""
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        key = next((k for k in (self.current, self.previous) if k is not None and k.key_id == copy.key_id), None)
        if key is None:
            raise SpecUnreadable(f"sealed with key {copy.key_id}, which this worker does not have "
                                 f"(spec_key_file / spec_previous_key_file)")
        blob = bytes(copy.blob)
        if len(blob) < _NONCE_BYTES + 16:
            raise SpecUnreadable(f"sealed copy too short (key {copy.key_id})")
        try:
            plain = AESGCM(key.key).decrypt(blob[:_NONCE_BYTES], blob[_NONCE_BYTES:],
                                            _ad(run_id, copy.ordinal, copy.key_id))
        except InvalidTag:
            raise SpecUnreadable(f"sealed copy fails authentication (key {copy.key_id}): not this run's, "
                                 f"not this attempt's, or altered") from None
        try:
            spec = json.loads(plain)
        except ValueError:
            raise SpecUnreadable("sealed copy holds no spec") from None
        if not isinstance(spec, dict):
            raise SpecUnreadable("sealed copy holds no spec")
        return spec
