"""Start the D1 profile's Worker under miniflare for a whole CI run: prints ``URL``, ``TOKEN`` and ``DIR``.

``python -m tests.support.start_miniflare`` starts it (in its own process group, so it outlives
this command) and exits; ``python -m tests.support.start_miniflare --stop DIR`` stops it. Export
the URL and token as ``CONTEXTFUL_TEST_D1_URL`` and ``CONTEXTFUL_TEST_D1_TOKEN`` to make every test
process share that one server (otherwise the test session starts its own on first use).
"""

from __future__ import annotations

import sys

from tests.support.miniflare_server import MiniflareServer


def main(argv: list[str]) -> int:
    if argv[:1] == ["--stop"]:
        MiniflareServer.stop_at(argv[1])
        return 0
    server = MiniflareServer().start()
    print(f"URL={server.url}")
    print(f"TOKEN={server.token}")
    print(f"DIR={server.base}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
