"""A real PostgreSQL server for tests and benchmarks, started in a private data directory.

Uses the machine's PostgreSQL binaries (Debian's ``/usr/lib/postgresql/<v>/bin``). PostgreSQL
refuses to run as root, so as root the server runs as the ``postgres`` user through ``runuser``.
Set ``CONTEXTFUL_TEST_POSTGRES_DSN`` to use a server that is already running instead.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile


def _bin_dir() -> str:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if found:
        return os.path.dirname(found[-1])
    pg_ctl = shutil.which("pg_ctl")
    if pg_ctl:
        return os.path.dirname(pg_ctl)
    raise RuntimeError("PostgreSQL server binaries not found; install Debian's postgresql package")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    def __init__(self, fsync: bool = False) -> None:
        self.fsync = fsync
        self.base = tempfile.mkdtemp(prefix="contextful-pg-")
        self.data = os.path.join(self.base, "data")
        self.port = _free_port()
        self.bin = _bin_dir()
        self.as_root = os.geteuid() == 0

    def _run(self, *argv: str) -> None:
        cmd = [os.path.join(self.bin, argv[0]), *argv[1:]]
        if self.as_root:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=self.base)

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def start(self) -> PostgresServer:
        if self.as_root:
            shutil.chown(self.base, "postgres", "postgres")
        self._run("initdb", "-D", self.data, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")
        options = (f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1 -c max_connections=200"
                   f" -c fsync={'on' if self.fsync else 'off'} -c shared_buffers=128MB")
        self._run("pg_ctl", "-D", self.data, "-o", options, "-l", os.path.join(self.base, "log"), "-w", "start")
        return self

    def stop(self) -> None:
        self.stop_at(self.base)

    @staticmethod
    def stop_at(base: str) -> None:
        """Stop the server whose private directory is ``base`` and remove it."""
        pg_ctl = [os.path.join(_bin_dir(), "pg_ctl"), "-D", os.path.join(base, "data"), "-m", "immediate", "-w", "stop"]
        if os.geteuid() == 0:
            pg_ctl = ["runuser", "-u", "postgres", "--", *pg_ctl]
        try:
            subprocess.run(pg_ctl, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=base)
        finally:
            shutil.rmtree(base, ignore_errors=True)
