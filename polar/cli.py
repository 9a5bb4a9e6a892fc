"""`polar` command line: each subcommand lives beside the code it drives and registers itself here."""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from importlib.metadata import PackageNotFoundError, version

# subcommand -> module exposing register(subparsers); modules import heavy deps only when run.
SUBCOMMANDS = {
    "serve": "polar_serve.cli",
    "proxy": "polar_mitm.cli",
    "traj": "polar_traj.cli",
    "run": "polar.run.cli",
    "submit": "workers.cli",  # also status, batches, cancel, policy, node, nodes
    "report": "polar.report.cli",
    "api": "workers.api.cli",
    "redteam": "polar.redteam.cli",
    "tasks": "polar.scoring.check",
    "train": "workers.train",
}


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error: the message and where the help is, not the whole usage block above it
    (subcommand parsers are of the same class)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every subcommand's parser; with `command` (a SUBCOMMANDS key) only that one's, so a `polar proxy` or
    `polar run` process does not import the other subcommands' modules (a tenth of a second each start)."""
    parser = Parser(prog="polar", description="Polar: any coding agent as a token-exact RL environment.")
    parser.add_argument("--version", action="version", version=f"polar {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for module_name in [SUBCOMMANDS[command]] if command in SUBCOMMANDS else SUBCOMMANDS.values():
        importlib.import_module(module_name).register(sub)
    return parser


def _version() -> str:
    try:
        return version("polar")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `polar traj stats | head`: the reader took what it wanted; say nothing
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the flush at exit must not fail again
        return 0  # not a failure: `set -o pipefail; polar … | head` succeeds


if __name__ == "__main__":
    sys.exit(main())
