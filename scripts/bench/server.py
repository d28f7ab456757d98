"""The server under test: a fresh redis-server on a free loopback port, with
the module (or none, for the fallback section), its counters (INFO
commandstats, CONFIG RESETSTAT, used_memory, process CPU), and `redis-cli
--pipe` to feed it command streams. Imports resp only."""

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

from .resp import Client

SERVER = os.environ.get("XCLOAK_SERVER", "redis-server")


def _nice_prefix():
    """The server and redis-benchmark run at nice -10 when allowed (root or
    CAP_SYS_NICE): other processes on a shared machine then preempt them less,
    which is what makes wall-clock usec_per_call noisy. Same for every command."""
    try:
        ok = subprocess.run(["nice", "-n", "-10", "true"], capture_output=True).returncode == 0
        probe = subprocess.run(["nice", "-n", "-10", "nice"], capture_output=True, text=True).stdout.strip()
        return ["nice", "-n", "-10"] if ok and probe.lstrip("-").isdigit() and int(probe) < 0 else []
    except OSError:
        return []


NICE = _nice_prefix()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One server. `module`: the xcloak build to load (None: no module), with
    `STORAGE storage` (compact by default, so that both forms can be created:
    `CONFIG SET xcloak.storage zset|compact` picks the form of the keys
    created next); `extra_modules`: more modules to load (redis-cell);
    `wrapper`: a command the server runs under (valgrind)."""

    def __init__(self, module=None, storage="compact", extra_modules=(), wrapper=()):
        self.dir = tempfile.mkdtemp(prefix="xcloak-bench-")
        self.port = free_port()
        self.log = os.path.join(self.dir, "server.log")
        self.has_module = module is not None
        modules = []
        if module:
            modules += ["--loadmodule", os.path.abspath(module)] + (["STORAGE", storage] if storage else [])
        for extra in extra_modules:
            modules += ["--loadmodule", os.path.abspath(extra)]
        self.proc = subprocess.Popen(
            [
                *NICE,
                *wrapper,
                SERVER,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                self.dir,
                "--save",
                "",
                "--appendonly",
                "no",
                "--logfile",
                self.log,
                *modules,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.time() + 60
        while True:
            try:
                self.client = Client(self.port)
                self.client.call("PING")
                break
            except (OSError, RuntimeError):
                if self.proc.poll() is not None or time.time() > deadline:
                    sys.exit("bench: the server did not start; its log:\n" + open(self.log).read())
                time.sleep(0.05)

    def stop(self):
        try:
            self.client.call("SHUTDOWN", "NOSAVE")
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def pipe(self, commands):
        """Sends an iterable of encoded commands with `redis-cli --pipe`;
        exits on any error reply."""
        proc = subprocess.Popen(
            ["redis-cli", "-p", str(self.port), "--pipe"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        # Its output is read as it comes: redis-cli prints every error reply,
        # and a full pipe would stop it reading what is sent.
        chunks = []
        reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: proc.stdout.read(65536), b"")))
        reader.start()
        batch = []
        for command in commands:
            batch.append(command)
            if len(batch) >= 20_000:
                proc.stdin.write(b"".join(batch))
                batch = []
        proc.stdin.write(b"".join(batch))
        proc.stdin.close()
        reader.join()
        output = b"".join(chunks).decode(errors="replace")
        proc.wait()
        match = re.search(r"errors: (\d+), replies: (\d+)", output)
        if proc.returncode != 0 or not match or match.group(1) != "0":
            sys.exit("bench: redis-cli --pipe failed: " + output)

    def reset_stats(self):
        self.client.call("CONFIG", "RESETSTAT")

    def stat(self, command):
        """(calls, usec per call) of `command` since the last CONFIG RESETSTAT,
        from the total `usec` (`usec_per_call` has two decimals: too coarse for
        a ratio of short measures)."""
        line = self.client.info("commandstats").get("cmdstat_" + command.lower(), "")
        fields = dict(part.split("=") for part in line.split(",") if "=" in part)
        calls = int(fields.get("calls", 0))
        return calls, int(fields["usec"]) / calls if calls else float("nan")

    def storage(self, form):
        """The form of the windows that calls create from now on (a server with the module)."""
        self.client.call("CONFIG", "SET", "xcloak.storage", form)

    def expect_type(self, key, expected):
        """Checks that a sample key really is in the intended form."""
        found = self.client.call("TYPE", key)
        if found != expected:
            sys.exit("bench: %s is a %s, expected %s" % (key, found, expected))

    def entries(self, key, window, now=None):
        """Live entries of a window in either form: XCLOAK.PEEK with the largest
        limit (count = limit - remaining)."""
        top = 1_000_000
        reply = self.client.call("XCLOAK.PEEK", key, window, top, *(("NOW", now) if now is not None else ()))
        return top - reply[2]

    def cpu_seconds(self):
        info = self.client.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def used_memory(self):
        return int(self.client.info("memory")["used_memory"])

    def now_ms(self):
        seconds, micros = self.client.call("TIME")
        return int(seconds) * 1000 + int(micros) // 1000
