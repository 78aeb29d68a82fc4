"""Helpers for tests that run real server processes on 127.0.0.1: a free port, waiting for `/health`, stopping."""

from __future__ import annotations

import signal
import socket
import subprocess
import time

import httpx


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, what: str, timeout: float = 180, path: str = "/health") -> None:
    """Wait until `url` + `path` answers 200; fail with the process's output if it exits or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"{what} exited: {proc.stdout.read() if proc.stdout else ''}"
        assert time.monotonic() < deadline, f"{what} did not come up"
        try:
            if httpx.get(f"{url}{path}", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
    """Send `sig` and wait; kill the process if it is still there after `timeout` seconds."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
