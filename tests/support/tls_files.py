"""Certificates for the mutual-TLS tests, made with the openssl commands the README gives."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

SERVER_NAME = "millstream.internal"


def make_certificates(directory: Path, name: str = "") -> dict[str, Path]:
    """A CA and one worker certificate it signed (for ``SERVER_NAME``), as the README's
    "Securing GetRows" makes them; ``name`` prefixes the files (a second, foreign CA)."""
    directory.mkdir(parents=True, exist_ok=True)
    p = name
    commands = [
        f"openssl req -x509 -newkey rsa:2048 -nodes -keyout {p}ca.key -out {p}ca.pem "
        f'-days 3650 -subj "/CN=millstream CA"',
        f"openssl req -newkey rsa:2048 -nodes -keyout {p}worker.key -out {p}worker.csr "
        f'-subj "/CN=millstream worker" -addext "subjectAltName=DNS:{SERVER_NAME}"',
        f"openssl x509 -req -in {p}worker.csr -CA {p}ca.pem -CAkey {p}ca.key -CAcreateserial "
        f"-copy_extensions copyall -out {p}worker.pem -days 3650",
    ]
    for command in commands:
        subprocess.run(shlex.split(command), cwd=directory, check=True, capture_output=True)
    return {
        "ca": directory / f"{p}ca.pem",
        "cert": directory / f"{p}worker.pem",
        "key": directory / f"{p}worker.key",
    }
