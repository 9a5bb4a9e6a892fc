"""`polar` command line: each subcommand lives beside the code it drives and registers itself here."""
from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module exposing register(subparsers); modules import heavy deps only when run.
SUBCOMMANDS = {
    "serve": "polar_serve.cli",
    "proxy": "polar_mitm.cli",
    "traj": "polar_traj.cli",
    "run": "polar.run.cli",
    "submit": "workers.cli",  # also status, cancel, policy, node
    "report": "polar.report.cli",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="polar", description="Polar: any coding agent as a token-exact RL environment.")
    sub = parser.add_subparsers(dest="command", required=True)
    for module_name in SUBCOMMANDS.values():
        importlib.import_module(module_name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
