"""polar_mitm/launch.py: a started proxy's CA is handed out only once mitmproxy has written it whole (it writes
the file in place: a copy taken while it was empty failed every TLS handshake of one sample's harness)."""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from polar_mitm.launch import wait_for_file

PEM = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_the_ca_is_waited_for_until_whole(tmp_path: Path):
    ca, log = tmp_path / "mitmproxy-ca-cert.pem", tmp_path / "log"
    ca.write_bytes(b"")  # created, not written yet
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        def write() -> None:
            time.sleep(0.3)
            ca.write_bytes(PEM[:20])  # half of it
            time.sleep(0.3)
            ca.write_bytes(PEM)

        writer = threading.Thread(target=write)
        writer.start()
        wait_for_file(ca, proc, log, timeout=10)
        assert ca.read_bytes() == PEM
        writer.join()
        ca.write_bytes(b"")
        with pytest.raises(RuntimeError, match="no whole"):
            wait_for_file(ca, proc, log, timeout=0.3)
    finally:
        proc.kill()
        proc.wait()
