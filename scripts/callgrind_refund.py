#!/usr/bin/env python3
"""Instructions per XCLOAK.REFUND on compact windows of 10 to 1,000,000 entries,
under callgrind: the repeatable companion of make bench's section 9, whose
usec_per_call moves by tens of percent on a loaded machine.

Usage: python3 scripts/callgrind_refund.py [path/to/libxcloak.so] [compact|zset]   (needs valgrind)

Each window holds lone entries 1,000 ms apart (window 10^12 ms). They are built
on a plain server with the module (STORAGE compact), DUMPed and RESTOREd into a
server under valgrind --tool=callgrind that collects only inside the REFUND
handler (--toggle-collect). Per size, 200 times each:
- newest: REFUND of the newest stamp, then the ALLOW ... NOW that puts it back;
- middle: REFUND of a stamp near the middle (all distinct), then its ALLOW.
It prints the handler's instructions per REFUND and how many refunds removed an
entry (all must: a refund that finds nothing costs less and would flatter the
figure)."""
import os, re, socket, subprocess, sys, time, random
FORM = sys.argv[2] if len(sys.argv) > 2 else "compact"
MOD = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target/release/libxcloak.so")
SIZES = [10, 1000, 100_000, 1_000_000]
CALLS = 200
BASE = 1_700_000_000_000
W = 10 ** 12

def enc(*a):
    out = b"*%d\r\n" % len(a)
    for x in a:
        x = x if isinstance(x, bytes) else str(x).encode()
        out += b"$%d\r\n%s\r\n" % (len(x), x)
    return out

class C:
    def __init__(s, port):
        for _ in range(600):
            try:
                s.s = socket.create_connection(("127.0.0.1", port)); break
            except OSError: time.sleep(0.1)
        s.f = s.s.makefile("rb")
    def reply(s):
        l = s.f.readline(); t = l[:1]; b = l[1:-2]
        if t == b"+": return b.decode()
        if t == b"-": raise RuntimeError(b.decode())
        if t == b":": return int(b)
        if t == b"$":
            n = int(b)
            if n < 0: return None
            d = s.f.read(n + 2); return d[:-2]
        if t == b"*":
            return [s.reply() for _ in range(int(b))]
    def pipe(s, cmds):
        n = 0; buf = []
        for c in cmds:
            buf.append(c); n += 1
            if len(buf) >= 1000:
                s.s.sendall(b"".join(buf)); buf = []
        if buf: s.s.sendall(b"".join(buf))
        return [s.reply() for _ in range(n)]
    def cmd(s, *a): return s.pipe([enc(*a)])[0]

def free_port():
    """A free loopback port in 10000..22767 (the tests' range: below the ephemeral ports)."""
    while True:
        port = random.randint(10000, 22767)
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) != 0:
                return port


def server(port, wrap=()):
    return subprocess.Popen(list(wrap) + ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no",
        "--loadmodule", MOD, "STORAGE", FORM], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

port = free_port()
p1 = server(port)
c = C(port)
dumps = {}
for n in SIZES:
    k = "k%d" % n
    c.pipe(enc("XCLOAK.ALLOW", k, W, 10**6, "NOW", BASE + i * 1000) for i in range(n))
    dumps[n] = c.cmd("DUMP", k)
p1.kill()
import tempfile
TMP = tempfile.mkdtemp(prefix="xcloak-callgrind-refund-")
out = os.path.join(TMP, "cg.out")
port = free_port()
p2 = server(port, ["valgrind", "--tool=callgrind", "--callgrind-out-file=" + out, "--collect-atstart=no",
                    "--toggle-collect=*commands*refund*"])
c = C(port)
c.cmd("PING")
print("%s: entries  newest(instr/call)  middle(instr/call)" % FORM)
for n in SIZES:
    k = "k%d" % n
    c.cmd("RESTORE", k, 0, dumps[n])
    res = []
    for kind in ("newest", "middle"):
        subprocess.run(["callgrind_control", "-z", str(p2.pid)], capture_output=True, check=True)
        cmds = []
        for j in range(CALLS):
            if kind == "newest":
                t = BASE + (n - 1) * 1000
                cmds.append(enc("XCLOAK.REFUND", k, t)); cmds.append(enc("XCLOAK.ALLOW", k, W, 10**6, "NOW", t))
            else:
                t = BASE + (n // 2 + j - CALLS // 2 if n > CALLS else j % n) * 1000
                cmds.append(enc("XCLOAK.REFUND", k, t)); cmds.append(enc("XCLOAK.ALLOW", k, W, 10**6, "NOW", t))
        r = c.pipe(cmds)
        subprocess.run(["callgrind_control", "-d", "%s-%d" % (kind, n), str(p2.pid)], capture_output=True, check=True)
        time.sleep(0.5)
        dump = sorted([f for f in os.listdir(TMP) if f.startswith("cg.out")], key=lambda f: os.path.getmtime(os.path.join(TMP, f)))[-1]
        txt = subprocess.run(["callgrind_annotate", os.path.join(TMP, dump)], capture_output=True, text=True).stdout
        m = re.search(r"([\d,]+).*PROGRAM TOTALS", txt)
        total = int(m.group(1).replace(",", ""))
        refunded = sum(1 for i, x in enumerate(r) if (i % 2 == 0) and x == 1)
        res.append("%d (%d of %d refunded)" % (total // CALLS, refunded, CALLS))
    print("%9d  %s  %s" % (n, res[0], res[1]))
p2.kill()
