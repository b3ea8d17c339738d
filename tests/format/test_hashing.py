"""The content hash in a process forked after a threaded hash (multiprocessing's default start
method on Linux, DataLoader workers): it must finish, and agree with the parent's."""

from __future__ import annotations

import os
import time

import pytest

from modulelens.format.hashing import ContentHasher, hash_bytes


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_after_a_threaded_hash_hashes_without_hanging() -> None:
    data = os.urandom(5 << 20)  # above the size that hashes on blake3's thread pool
    expected = hash_bytes(data)
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only when both hashes agree with the parent's
        streamed = ContentHasher()
        streamed.update(data)
        os._exit(0 if hash_bytes(data) == expected == streamed.digest() else 3)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child's hash hung (it waited for blake3 threads that fork does not copy)")
