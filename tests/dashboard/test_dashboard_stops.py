"""`privrelease dashboard` stopped with SIGTERM (what a service manager sends) used to leave its
Streamlit server running as an orphan that kept serving the workspace (issue 57, item 10). The
command now is the server: the signal stops it, and the port closes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _serving(port: int) -> list[int]:
    """Processes whose command line is a Streamlit server on `port`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"streamlit" in args and str(port).encode() in args:
            found.append(int(entry.name))
    return found


def test_sigterm_stops_the_server_with_the_command(tmp_path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PRIVRELEASE_HOME": str(tmp_path / "ws")}
    run = [sys.executable, "-c", "from release.entry import main; main()"]
    subprocess.run([*run, "init"], env=env, cwd=ROOT, check=True, capture_output=True)
    port = _free_port()
    proc = subprocess.Popen(
        [*run, "dashboard", "--port", str(port)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while not _listening(port):
            assert proc.poll() is None, "the dashboard exited before it served"
            assert time.monotonic() < deadline, "the dashboard never listened"
            time.sleep(0.1)
        assert _serving(port) == [proc.pid]  # no second process to be left behind
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        deadline = time.monotonic() + 30
        while (_listening(port) or _serving(port)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _listening(port) and _serving(port) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
