"""`kvgguf serve` processes for the tests: started on a free loopback port, waited for, and
stopped at the end (tests/test_serve.py, tests/test_redis_cache.py)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

KVGGUF = shutil.which("kvgguf", path=str(Path(sys.executable).parent)) or "kvgguf"
START_TIMEOUT_S = 180


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


@contextlib.contextmanager
def kvgguf_serve(args: list, log: Path, env: dict):
    """Yields the base URL of `kvgguf serve ARGS --host 127.0.0.1 --port P` once it answers;
    its output goes to log."""
    port = free_port()
    with open(log, "w") as out:
        proc = subprocess.Popen([KVGGUF, "serve", *args, "--host", "127.0.0.1", "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ, **env))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"kvgguf serve exited with {proc.returncode}:\n{log.read_text()}")
            try:
                get_json(base + "/v1/models")
                break
            except OSError:
                if time.time() > deadline:
                    pytest.fail(f"kvgguf serve did not answer within {START_TIMEOUT_S} s:\n{log.read_text()}")
                time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
