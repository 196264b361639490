"""A real, throwaway PostgreSQL server for the records tests.

``PgServer.start()`` runs ``initdb`` and ``pg_ctl start`` in a fresh temporary folder,
listening on 127.0.0.1 on a free port (and a Unix socket in that folder only), and
``stop()`` removes it all. As root, the server runs as the ``postgres`` user (initdb
refuses root). Authentication is ``trust`` except for the role :data:`PASSWORD_USER`,
which must give its password (SCRAM), for the tests that check it is never shown.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

PASSWORD_USER = "farmer"
INSTALL_HINT = "run EXTRAS=farm bash scripts/install.sh (it installs Debian's postgresql)"


def find_bindir() -> Path:
    """The folder of ``initdb`` and ``pg_ctl``; raises RuntimeError saying how to get them."""
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name)
    )
    for folder in reversed(candidates):
        if (Path(folder) / "initdb").is_file():
            return Path(folder)
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).parent
    raise RuntimeError(f"PostgreSQL server binaries (initdb, pg_ctl) not found: {INSTALL_HINT}")


def _runuser() -> str:
    """util-linux's runuser; it lives in sbin, which a PATH may leave out."""
    found = shutil.which("runuser") or shutil.which("runuser", path="/usr/sbin:/sbin")
    if found is None:
        raise RuntimeError("runuser (util-linux) not found: the server must run as 'postgres'")
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PgServer:
    """One server; :meth:`url` names a database on it, :meth:`new_database` makes one."""

    def __init__(self) -> None:
        self.bindir = find_bindir()
        self.port = _free_port()
        self.root = Path(tempfile.mkdtemp(prefix="autosched-pg-"))
        self.data = self.root / "data"
        self.user = "postgres" if os.geteuid() == 0 else None
        self.superuser = "postgres" if self.user else os.environ.get("USER", "postgres")

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(self.bindir / argv[0]), *argv[1:]]
        if self.user:
            command = [_runuser(), "-u", self.user, "--", *command]
        return subprocess.run(command, check=check, capture_output=True, text=True, timeout=120)

    def start(self) -> PgServer:
        if self.user:
            shutil.chown(self.root, self.user)
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            self.superuser,
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        )
        (self.data / "pg_hba.conf").write_text(
            "local all all trust\n"
            f"host all {PASSWORD_USER} 127.0.0.1/32 scram-sha-256\n"
            "host all all 127.0.0.1/32 trust\n"
        )
        with (self.data / "postgresql.conf").open("a") as conf:
            # Speed over surviving a power cut; a committed transaction still survives a
            # crash of the server (the restart tests need that).
            conf.write("fsync = off\nfull_page_writes = off\n")
        self.pg_ctl_start()
        self.psql(f"CREATE ROLE {PASSWORD_USER} LOGIN SUPERUSER PASSWORD 's3cr3t-Pa55'")
        return self

    def pg_ctl_start(self) -> None:
        options = f"-k {self.root} -h 127.0.0.1 -p {self.port}"
        log = str(self.root / "server.log")
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", log, "-w", "start")

    def pg_ctl_stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self, *, pause_s: float = 0.0, mode: str = "immediate") -> None:
        """Stop the server (``immediate``: like a crash) and start it again."""
        self.pg_ctl_stop(mode)
        time.sleep(pause_s)
        self.pg_ctl_start()

    def stop(self) -> None:
        try:
            self.pg_ctl_stop("immediate")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.root, ignore_errors=True)

    def psql(self, sql: str, database: str = "postgres") -> str:
        done = self._run(
            "psql",
            "-X",
            "-q",
            "-t",
            "-A",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            self.superuser,
            "-d",
            database,
            "-c",
            sql,
        )
        return done.stdout.strip()

    def url(self, database: str = "postgres", *, user: str | None = None) -> str:
        return f"postgresql://{user or self.superuser}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; returns its name."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        self.psql(f"CREATE DATABASE {name}")
        return name
