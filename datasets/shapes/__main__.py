"""``python -m contextful.datasets.shapes SHAPE N OUT_DIR [--shards K] [--seed S]``."""

from __future__ import annotations

import argparse
import sys

from .shards import SHAPES, write_shards


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m contextful.datasets.shapes")
    parser.add_argument("shape", choices=SHAPES)
    parser.add_argument("n", type=int)
    parser.add_argument("out_dir")
    parser.add_argument("--shards", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    for path in write_shards(args.shape, args.n, args.out_dir, args.shards, args.seed):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
