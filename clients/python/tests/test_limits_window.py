"""get_moving_window right after a rejection answers from the rejection's
reply (xcloak/_window.py), sync and asyncio; anything else sends the PEEK.

What would fail: a PEEK sent after a rejection (two commands where one does),
also when the headers are asked from another thread (slowapi's exception
handler), an answer kept for another key, limit or window, reused twice,
outliving the rejection's retry_after or a clear, kept after an admission
(then a PEEK is the only way to know the window's oldest entry), or more than
_window.SIZE answers kept.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from limits.storage import storage_from_string

import xcloak.limits  # noqa: F401
from servers import Server


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


def test_sync_storage(server):
    storage = storage_from_string(f"xcloak://127.0.0.1:{server.port}")
    assert all(storage.acquire_entry("k", 2, 60) for _ in range(2))
    start = time.time()
    assert not storage.acquire_entry("k", 2, 60)
    oldest, count = storage.get_moving_window("k", 2, 60)
    assert server.calls("xcloak.peek") == 0 and count == 2 and start - 1 < oldest <= time.time()
    # Once only: the next one reads the server, and agrees.
    peeked, count = storage.get_moving_window("k", 2, 60)
    assert server.calls("xcloak.peek") == 1 and count == 2 and abs(peeked - oldest) < 0.5
    # Not for another key, limit or window, nor after an admission.
    for args in (("other", 2, 60), ("k", 3, 60), ("k", 2, 30)):
        assert not storage.acquire_entry("k", 2, 60)
        storage.get_moving_window(*args)
    assert server.calls("xcloak.peek") == 4
    assert storage.acquire_entry("fresh", 2, 60)
    storage.get_moving_window("fresh", 2, 60)
    assert server.calls("xcloak.peek") == 5
    # Nor once the rejection's retry_after has passed.
    assert all(storage.acquire_entry("short", 1, 0.3) for _ in range(1))
    assert not storage.acquire_entry("short", 1, 0.3)
    time.sleep(0.35)
    assert storage.get_moving_window("short", 1, 0.3)[1] == 0
    assert server.calls("xcloak.peek") == 6
    # From another thread too (slowapi asks for the headers in its exception handler).
    assert not storage.acquire_entry("k", 2, 60)
    import threading

    seen = []
    thread = threading.Thread(target=lambda: seen.append(storage.get_moving_window("k", 2, 60)))
    thread.start()
    thread.join()
    assert seen[0][1] == 2 and server.calls("xcloak.peek") == 6
    # Not after a clear.
    assert not storage.acquire_entry("k", 2, 60)
    storage.clear("k")
    assert storage.get_moving_window("k", 2, 60)[1] == 0 and server.calls("xcloak.peek") == 7


def test_the_answers_kept_are_bounded():
    from xcloak import _window
    from xcloak.decision import Decision

    rejections = _window.Rejections()
    full = Decision(allowed=False, limit=1, remaining=0, retry_after_ms=1000, reset_after_ms=1000, window_ms=60000)
    for i in range(_window.SIZE + 10):
        rejections.remember(f"k{i}", 1, 60, 1, full, 1_000_000)
    assert len(rejections._answers) == _window.SIZE
    assert rejections.recall("k0", 1, 60, 1_000_001) is None, "the oldest went first"
    assert rejections.recall(f"k{_window.SIZE + 9}", 1, 60, 1_000_001) == ((1_000_000 + 1000 - 60000) / 1000, 1)


def test_async_storage(server):
    async def main():
        storage = storage_from_string(f"async+xcloak://127.0.0.1:{server.port}")
        assert all([await storage.acquire_entry("k", 2, 60) for _ in range(2)])
        assert not await storage.acquire_entry("k", 2, 60)
        oldest, count = await storage.get_moving_window("k", 2, 60)
        assert server.calls("xcloak.peek") == 0 and count == 2 and oldest <= time.time()
        await storage.get_moving_window("k", 2, 60)
        assert server.calls("xcloak.peek") == 1

    asyncio.run(main())
