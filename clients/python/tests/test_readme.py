"""The README's first example, extracted and run as written, against a live
server this test starts: with the module, without it (the Lua fallback), and
with no server at all.

What would fail: an example that does not run as written (an undefined name,
a missing import), a decision or header misprinted, the default policy
failing open silently when Redis is gone (it must raise, and print nothing
that looks like a success), an install line that names a package not
published (the README must open with the install from the checkout).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from servers import Server, free_port

README = Path(__file__).resolve().parents[1] / "README.md"


def first_block(language: str) -> str:
    match = re.search(rf"```{language}\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert match, f"no {language} block in the README"
    return match.group(1)


def run_example(redis_url: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, REDIS_URL=redis_url)
    return subprocess.run([sys.executable, "-c", first_block("python")], env=env, capture_output=True, text=True,
                          timeout=60)


def test_the_readme_opens_with_the_install_that_works_today():
    install = first_block("sh")
    commands = [line.split("#")[0].strip() for line in install.splitlines() if line.split("#")[0].strip()]
    assert commands[0] == "pip install ./clients/python", "the first install line works from the checkout"
    assert all("./clients/python" in c for c in commands), "every install line works today"
    assert "once published: pip install xcloak" in install


@pytest.mark.parametrize("module", [True, False], ids=["command", "script"])
def test_the_first_example_runs_as_written(module):
    server = Server(module=module)
    try:
        result = run_example(f"redis://127.0.0.1:{server.port}")
        assert result.returncode == 0, result.stderr
        via = "command" if module else "script"
        lines = result.stdout.splitlines()
        assert lines[:3] == [f"allowed, {n} left (via {via})" for n in (2, 1, 0)], result.stdout
        assert re.fullmatch(r"rejected, retry in (0:00:59\.\d{6}|0:01:00); headers \{'RateLimit-Policy': "
                            r"'\"3-in-60s\";q=3;w=60', 'RateLimit': '\"3-in-60s\";r=0;t=60', 'Retry-After': '60'\}",
                            lines[3]), lines[3]
        assert len(lines) == 4
        assert server.client().zcard("rl:demo:alice") == 3
    finally:
        server.close()


def test_the_first_example_does_not_fail_open_silently():
    result = run_example(f"redis://127.0.0.1:{free_port()}")  # nothing listens there
    assert result.returncode != 0
    assert "xcloak.errors.UnavailableError" in result.stderr, result.stderr[-2000:]
    assert "allowed" not in result.stdout
