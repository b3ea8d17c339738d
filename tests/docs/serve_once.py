"""Run a documented server command (``modulelens ui ...``) as a reader would: start it, open the
address it prints, stop it. A server runs until Ctrl+C, so the docs test cannot run it as written
to the end; this is the nearest thing: the command as written, its page fetched once.

Usage: python serve_once.py COMMAND [ARGS...]; exits 0 when the printed address answered 200.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

STARTUP_SECONDS = 180  # a busy 2-core CI machine imports the web stack and opens the repo in this


def main(argv: list[str]) -> int:
    server = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              stdin=subprocess.DEVNULL)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(server.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    deadline = time.monotonic() + STARTUP_SECONDS
    try:
        while time.monotonic() < deadline and server.poll() is None:
            address = next((m.group(0) for line in list(lines) if (m := re.search(r"http://\S+", line))), None)
            if address:
                with urllib.request.urlopen(address, timeout=60) as response:
                    print(f"{' '.join(argv)}: {address} answered {response.status}")
                    return 0 if response.status == 200 else 1
            time.sleep(0.2)
        print(f"{' '.join(argv)}: no address printed (exit code {server.poll()}):\n{''.join(lines)}", file=sys.stderr)
        return 1
    finally:
        server.send_signal(signal.SIGINT)  # Ctrl+C, as the server's own message says
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        print("".join(lines), end="")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
