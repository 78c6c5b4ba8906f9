"""PostgreSQL and Redis servers of the test run's own, on loopback ports in temporary folders,
from Debian's ``postgresql`` and ``redis-server`` packages (``scripts/test_services.sh``
installs them; CI runs it). Where a package, or the database driver, is missing, the tests that
need it skip with that reason (a failure under ``TOKENWIRE_STRICT_SKIPS=1``)."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest

__all__ = ["postgres_server", "redis_server"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ready(port: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return True
        time.sleep(0.1)
    return False


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    paths = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return paths[-1] if paths else None


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """A PostgreSQL server until the block ends; yields its URL."""
    pytest.importorskip("psycopg", reason="needs pip install 'tokenwire[stores]' (psycopg)")
    initdb, postgres = _pg_bin("initdb"), _pg_bin("postgres")
    if initdb is None or postgres is None:
        pytest.skip("PostgreSQL is not installed (scripts/test_services.sh installs it)")
    as_user: list[str] = []
    folder = tempfile.mkdtemp(prefix="tokenwire-pg-")
    if os.geteuid() == 0:  # (PostgreSQL refuses to run as root: as its own user)
        try:
            import pwd

            pw = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("no postgres user to run PostgreSQL as (install Debian's postgresql)")
        os.chown(folder, pw.pw_uid, pw.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data = os.path.join(folder, "data")
    subprocess.run(
        [*as_user, initdb, "-D", data, "--auth=trust", "-U", "postgres", "-E", "UTF8"],
        check=True,
        capture_output=True,
    )
    port = _port()
    proc = subprocess.Popen(
        [
            *as_user,
            postgres,
            "-D",
            data,
            "-p",
            str(port),
            "-k",
            folder,
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "fsync=off",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        if not _ready(port):
            raise RuntimeError("PostgreSQL did not start")
        url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        import psycopg

        deadline = time.monotonic() + 30
        while True:  # (the port opens before the server takes connections)
            try:
                psycopg.connect(url, connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    """A Redis server until the block ends; yields its URL."""
    pytest.importorskip("redis", reason="needs pip install 'tokenwire[stores]' (redis)")
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (scripts/test_services.sh installs it)")
    folder = tempfile.mkdtemp(prefix="tokenwire-redis-")
    port = _port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", folder],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        if not _ready(port):
            raise RuntimeError("Redis did not start")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        shutil.rmtree(folder, ignore_errors=True)
