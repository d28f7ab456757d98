"""A minimal RESP2 client on the standard library: `encode` a command, `Client`
to call one and read its reply. Shared by the bench and scripts/fixtures.py.
Imports nothing of the package."""

import socket


def encode(*args):
    """One command as RESP bytes (arguments: bytes, or anything str() turns into text)."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        if not isinstance(arg, bytes):
            arg = str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(out)


class Client:
    """One connection to 127.0.0.1:port. Bulk replies are text, or bytes with
    `raw=True` (DUMP payloads are binary). An error reply raises RuntimeError."""

    def __init__(self, port, raw=False):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.file = self.sock.makefile("rb")
        self.raw = raw

    def call(self, *args):
        self.sock.sendall(encode(*args))
        return self.read()

    def text(self, *args):
        """A call whose bulk reply is decoded even on a raw client."""
        reply = self.call(*args)
        return reply.decode() if isinstance(reply, bytes) else reply

    def read(self):
        line = self.file.readline()
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.file.read(n + 2)[:-2]
            return data if self.raw else data.decode(errors="replace")
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise RuntimeError("bad reply %r" % line)

    def info(self, section):
        """One INFO section as {field: value} (text)."""
        fields = {}
        for line in self.text("INFO", section).splitlines():
            if ":" in line and not line.startswith("#"):
                name, value = line.split(":", 1)
                fields[name] = value
        return fields

    def close(self):
        self.sock.close()
