"""`python -m polar_serve serve …`: the same as `polar serve …`, without loading the other subcommands."""
from __future__ import annotations

import argparse
import sys

from polar_serve.cli import register


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m polar_serve")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
