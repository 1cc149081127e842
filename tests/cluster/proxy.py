"""A TCP proxy between a worker and PostgreSQL that produces real network faults.

- :meth:`Proxy.cut_after_commit` — the next time a client sends a statement containing a marker
  (e.g. ``ql_complete``), the statement reaches the server, the server runs and commits it (an
  autocommit call: the server commits before it answers), and as soon as the server's answer is
  complete (its ``ReadyForQuery`` message) the proxy closes both sockets *without* forwarding it:
  the client has no idea whether its call committed — a lost COMMIT response.
- :meth:`Proxy.partition` — stop forwarding in both directions; connections stay open and new ones
  are accepted but nothing gets through (packets dropped, the peer never answers).
- :meth:`Proxy.heal` — drop every connection (their streams are broken) and forward again.
- :meth:`Proxy.corrupt_next_bulk` — flip one bit in the middle of the next large piece a client
  sends (a bulk parameter such as a log chunk's bytes): corruption in transit that only a checksum
  computed by the server can notice.

The client must not use TLS through it (``sslmode=disable``) so that the marker is visible; the
proxy reads nothing else of the protocol but message boundaries of the server's answer.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass, field

__all__ = ["Proxy"]


@dataclass
class _Pair:
    client: socket.socket
    server: socket.socket
    closed: bool = False
    #: The client's marked statement went to the server: cut once its answer is complete.
    armed: bool = False
    holding: bool = False
    answer: bytearray = field(default_factory=bytearray)


class Proxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: list[_Pair] = []
        self._blocked = False
        self._marker: bytes | None = None
        self._corrupt_min: int | None = None
        self.corrupted = 0
        self.cuts = 0
        self._stopped = False
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    # -- faults ----------------------------------------------------------------------------------
    def cut_after_commit(self, marker: str) -> None:
        with self._lock:
            self._marker = marker.encode()

    def corrupt_next_bulk(self, min_bytes: int = 16384) -> None:
        with self._lock:
            self._corrupt_min = min_bytes

    def partition(self) -> None:
        with self._lock:
            self._blocked = True

    def heal(self) -> None:
        with self._lock:
            self._blocked = False
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            self._close(pair)

    def close(self) -> None:
        self._stopped = True
        with contextlib.suppress(OSError):
            self._listener.close()
        self.heal()

    # -- plumbing ---------------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _addr = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=10)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            pair = _Pair(client, server)
            with self._lock:
                self._pairs.append(pair)
            threading.Thread(target=self._pump, args=(pair, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(pair, False), daemon=True).start()

    @staticmethod
    def _close(pair: _Pair) -> None:
        pair.closed = True
        for sock in (pair.client, pair.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def _pump(self, pair: _Pair, upstream: bool) -> None:
        src, dst = (pair.client, pair.server) if upstream else (pair.server, pair.client)
        while not pair.closed:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                self._close(pair)
                return
            with self._lock:
                blocked = self._blocked
                if upstream and self._marker is not None and self._marker in data:
                    self._marker = None
                    pair.armed = True
                if upstream and self._corrupt_min is not None and len(data) >= self._corrupt_min:
                    self._corrupt_min = None
                    self.corrupted += 1
                    middle = len(data) // 2
                    data = data[:middle] + bytes([data[middle] ^ 0x01]) + data[middle + 1:]
            if blocked:
                continue  # dropped on the floor: the peer never hears of it
            if not upstream and pair.armed:
                pair.answer += data
                forward, cut = _split_answer(pair)
                if forward:
                    try:
                        dst.sendall(forward)
                    except OSError:
                        self._close(pair)
                        return
                if cut:
                    with self._lock:
                        self.cuts += 1
                    self._close(pair)  # committed at the server; the answer is never delivered
                    return
                continue
            try:
                dst.sendall(data)
            except OSError:
                self._close(pair)
                return


def _split_answer(pair: _Pair) -> tuple[bytes, bool]:
    """Of the server's complete messages in ``pair.answer``: what may still reach the client, and
    whether to cut now. A prepared call first gets its statement described (forwarded: nothing ran
    yet); once an execution result arrives (DataRow 'D' / CommandComplete 'C') everything is held
    back, and at the ReadyForQuery ('Z') that ends it — the call has committed — the proxy cuts."""
    buffer, forward, i = pair.answer, bytearray(), 0
    while i + 5 <= len(buffer):
        kind = buffer[i]
        length = int.from_bytes(buffer[i + 1:i + 5], "big")
        if i + 1 + length > len(buffer):
            break
        message = bytes(buffer[i:i + 1 + length])
        i += 1 + length
        if kind in (ord("D"), ord("C")):
            pair.holding = True
        if pair.holding:
            if kind == ord("Z"):
                return bytes(forward), True
            continue
        forward += message
    del buffer[:i]
    return bytes(forward), False
