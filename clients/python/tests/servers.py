"""Real redis-server processes on loopback for the tests (no mocks of Redis).

Ports come from this package's slice, 20000-20999 (a cluster's bus port is the
port + 10000), each checked free before use. The module is $XCLOAK_MODULE
(default: the checkout's target/release/libxcloak.so), the server
$XCLOAK_SERVER (default redis-server). Every process started is stopped at
the end, whatever happens.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import List, Optional

import redis

HERE = Path(__file__).resolve().parent
REPO = Path(os.environ.get("XCLOAK_REPO", HERE.parents[2]))
MODULE = os.environ.get("XCLOAK_MODULE", str(REPO / "target/release/libxcloak.so"))
SERVER = os.environ.get("XCLOAK_SERVER", "redis-server")
PORTS = range(20000, 21000)
_used: set = set()


def _free(port: int) -> bool:
    for p in (port, port + 10000):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", p))
            except OSError:
                return False
    return True


def free_port() -> int:
    candidates = [p for p in PORTS if p not in _used]
    random.shuffle(candidates)
    for port in candidates:
        if _free(port):
            _used.add(port)
            return port
    raise RuntimeError("no free port in 20000-20999")


def server_version() -> tuple:
    out = subprocess.run([SERVER, "--version"], capture_output=True, text=True).stdout
    version = out.split("v=")[1].split()[0]
    return tuple(int(x) for x in version.split("."))


def raw(client: redis.Redis, *args):
    """A command's reply as the server sent it (no redis-py response callback)."""
    conn = client.connection_pool.get_connection()
    try:
        conn.send_command(*args)
        return conn.read_response()
    finally:
        client.connection_pool.release(conn)


class Server:
    """One redis-server; ``module=False`` starts it without xcloak (the fallback's case)."""

    def __init__(self, module: bool = True, args: Optional[List[str]] = None, port: Optional[int] = None,
                 storage: Optional[str] = None) -> None:
        self.module = module
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix="xcloak-py-")
        self.args = list(args or [])
        self.storage = storage
        self.proc: Optional[subprocess.Popen] = None
        self.start()

    def command_line(self) -> List[str]:
        line = [SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", self.dir, "--logfile", os.path.join(self.dir, "log")]
        if self.module:
            line += ["--loadmodule", MODULE] + (["STORAGE", self.storage] if self.storage else [])
        return line + self.args

    def start(self) -> None:
        self.proc = subprocess.Popen(self.command_line(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                if self.client().ping():
                    return
            except redis.RedisError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on {self.port} did not start: {self.log()[-2000:]}")
            time.sleep(0.02)

    def log(self) -> str:
        try:
            return Path(self.dir, "log").read_text()
        except OSError:
            return ""

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kwargs) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5, **kwargs)

    def calls(self, command: str) -> int:
        """``cmdstat_<command>:calls=N`` of INFO commandstats (0 if never called)."""
        stats = self.client().info("commandstats")
        return int(stats.get(f"cmdstat_{command.lower()}", {}).get("calls", 0))

    def pause(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class Cluster:
    """``primaries`` primaries with ``replicas`` replicas each; ``without_module``
    names primaries (by index) started without xcloak (with their replicas)."""

    def __init__(self, primaries: int = 3, replicas: int = 0, without_module=(), module: bool = True) -> None:
        self.nodes: List[Server] = []
        count = primaries * (1 + replicas)
        try:
            for i in range(count):
                primary_index = i if i < primaries else (i - primaries) % primaries
                has_module = module and primary_index not in without_module
                self.nodes.append(Server(module=has_module, args=[
                    "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", "5000", "--appendonly", "no"]))
            addresses = [f"127.0.0.1:{n.port}" for n in self.nodes[:primaries]]
            subprocess.run(["redis-cli", "--cluster", "create", *addresses, "--cluster-yes"], check=True,
                           capture_output=True, timeout=60)
            for i, node in enumerate(self.nodes[primaries:]):
                primary = self.nodes[i % primaries]
                node_id = raw(primary.client(), "CLUSTER", "MYID").decode()
                subprocess.run(["redis-cli", "--cluster", "add-node", f"127.0.0.1:{node.port}",
                                f"127.0.0.1:{primary.port}", "--cluster-slave", "--cluster-master-id", node_id],
                               check=True, capture_output=True, timeout=60)
            self.wait_ok(replicas)
        except BaseException:
            self.close()
            raise
        self.primaries = self.nodes[:primaries]
        self.replicas = self.nodes[primaries:]

    def wait_ok(self, replicas: int) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ok = True
            for node in self.nodes:
                info = raw(node.client(), "CLUSTER", "INFO").decode()
                if "cluster_state:ok" not in info:
                    ok = False
                slots = raw(node.client(), "CLUSTER", "SLOTS")
                if not slots or any(len(r) < 3 + replicas for r in slots):
                    ok = False
            if ok:
                return
            time.sleep(0.2)
        raise RuntimeError("cluster did not become ok")

    def owner(self, key: str) -> Server:
        slot = raw(self.nodes[0].client(), "CLUSTER", "KEYSLOT", key)
        for r in raw(self.nodes[0].client(), "CLUSTER", "SLOTS"):
            if r[0] <= slot <= r[1]:
                port = r[2][1]
                return next(n for n in self.nodes if n.port == port)
        raise KeyError(key)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.nodes[0].port}"

    def close(self) -> None:
        for node in self.nodes:
            node.close()
