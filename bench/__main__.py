"""``python -m bench report [...]`` from the repository root: see bench/report.py."""

from __future__ import annotations

import sys

from bench import report

if __name__ == "__main__":
    if sys.argv[1:2] != ["report"]:
        sys.exit("usage: python -m bench report [--only a,b] [--skip a,b] [--out DIR] [--full] [--no-run]")
    sys.exit(report.main(sys.argv[2:]))
