"""Start a PostgreSQL server for a whole CI run: prints ``DSN`` and ``DATA`` lines for the shell.

``python -m tests.support.start_postgres`` starts the server (it daemonizes through pg_ctl) and
exits; ``python -m tests.support.start_postgres --stop DATA`` stops it. ``.ci/run`` exports the DSN
as ``CONTEXTFUL_TEST_POSTGRES_DSN`` so every test process shares that one server.
"""

from __future__ import annotations

import sys

from tests.support.postgres_server import PostgresServer


def main(argv: list[str]) -> int:
    if argv[:1] == ["--stop"]:
        PostgresServer.stop_at(argv[1])
        return 0
    server = PostgresServer().start()
    print(f"DSN={server.dsn}")
    print(f"DATA={server.base}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
