"""Servers for the tests and benchmarks: `kvgguf serve` and redis-server processes started on a
free loopback port, waited for, and stopped at the end (tests/server/test_serve.py,
tests/server/test_redis_cache.py, benchmarks/shared_cache.py)."""

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
        proc = subprocess.Popen(
            [KVGGUF, "serve", *args, "--host", "127.0.0.1", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, **env),
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"kvgguf serve exited with {proc.returncode}:\n{log.read_text()}")
            try:
                get_json(base + "/v1/models")
                break
            except OSError:
                if time.time() > deadline:
                    raise RuntimeError(f"kvgguf serve did not answer within {START_TIMEOUT_S} s:\n{log.read_text()}")
                time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def redis_server_binary() -> str | None:
    """redis-server's path, or None (scripts/system_packages.sh installs Debian's package)."""
    return shutil.which("redis-server")


class RedisServer:
    """redis-server on a free loopback port: no persistence, its files in folder."""

    def __init__(self, binary: str, folder, maxmemory: str = "0", policy: str = "noeviction"):
        self.binary, self.folder, self.maxmemory, self.policy = binary, folder, maxmemory, policy
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = None
        self.start()

    def start(self) -> None:
        import redis

        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.folder),
                "--maxmemory",
                self.maxmemory,
                "--maxmemory-policy",
                self.policy,
                "--enable-debug-command",
                "local",
            ],  # DEBUG SLEEP: a Redis that answers late
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port)
        for _ in range(200):
            try:
                client.ping()
                return
            except redis.exceptions.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
