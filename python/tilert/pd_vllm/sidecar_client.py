"""The plugin's side of the ``tilert connector-sidecar`` unix socket:
length-prefixed JSON frames (docs/PROTOCOL.md section 8)."""

from __future__ import annotations

import json
import socket
import struct
import threading
from typing import Callable

SOCKET_VERSION = 1
MAX_FRAME = 16 << 20


class SidecarError(RuntimeError):
    pass


class SidecarClient:
    """One connection, reconnected on failure; safe to share between the
    forward thread and the plugin's sender thread. ``on_connect`` runs after
    every (re)connect's hello, e.g. to register the caches again with a
    sidecar that restarted."""

    def __init__(self, path: str, timeout: float = 10.0, on_connect: Callable[["SidecarClient"], None] | None = None):
        self.path = path
        self.timeout = timeout
        self.on_connect = on_connect
        self._sock: socket.socket | None = None
        self._lock = threading.RLock()
        self.hello: dict | None = None
        self.connects = 0

    def _connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self.path)
        except OSError:
            s.close()
            raise
        self._sock = s
        hello = self._round_trip({"type": "hello"})
        if hello.get("type") != "hello" or hello.get("protocol_version") != SOCKET_VERSION:
            self.close()
            raise SidecarError(f"sidecar at {self.path} answered hello with {hello!r}")
        self.hello = hello
        self.connects += 1
        if self.on_connect is not None:
            self.on_connect(self)

    def _recv_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self._sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("sidecar closed the socket")
            buf += chunk
        return bytes(buf)

    def _round_trip(self, msg: dict) -> dict:
        payload = json.dumps(msg, separators=(",", ":")).encode()
        if len(payload) > MAX_FRAME:
            raise SidecarError(f"frame of {len(payload)} bytes exceeds {MAX_FRAME}")
        self._sock.sendall(struct.pack(">I", len(payload)) + payload)
        (n,) = struct.unpack(">I", self._recv_exact(4))
        if n == 0 or n > MAX_FRAME:
            raise SidecarError(f"sidecar sent a frame of {n} bytes")
        return json.loads(self._recv_exact(n))

    def ensure(self) -> dict:
        """Connect (and hello) if needed; returns the sidecar's hello."""
        with self._lock:
            if self._sock is None:
                try:
                    self._connect()
                except (OSError, ConnectionError, ValueError) as e:
                    self.close()
                    raise SidecarError(f"sidecar at {self.path}: {e}") from e
            return self.hello

    def staging_dir(self) -> str:
        return self.ensure()["staging_dir"]

    def request(self, msg: dict, retry: bool = True) -> dict:
        """Send one message, reconnecting once if the connection had dropped."""
        with self._lock:
            for attempt in (0, 1):
                try:
                    if self._sock is None:
                        self._connect()
                    return self._round_trip(msg)
                except (OSError, ConnectionError, ValueError) as e:
                    self.close()
                    if attempt == 1 or not retry:
                        raise SidecarError(f"sidecar at {self.path}: {e}") from e
            raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                try:
                    self._sock.close()
                finally:
                    self._sock = None
