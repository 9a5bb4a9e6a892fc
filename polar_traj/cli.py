"""`polar traj build | stats | export`: registered by polar/cli.py; heavy imports wait until a command runs."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable

PROGRESS_MIN_SESSIONS = 20  # below this many capture files no bar is drawn


def register(subparsers: Any) -> None:
    traj = subparsers.add_parser("traj", help="trajectories from captured calls (Parquet)",
                                 description="Build, inspect and export trajectory tables.")
    sub = traj.add_subparsers(dest="traj_command", required=True)

    build = sub.add_parser("build", help="capture directory -> trajectory Parquet")
    build.add_argument("capture_dir", help="capture root, one task directory, or one session .jsonl")
    build.add_argument("-o", "--output", required=True, help="OUT.parquet, or a directory to add a part to")
    build.add_argument("--strategy", choices=("prefix_merge", "per_request"), default="prefix_merge")
    build.add_argument("--rewards", help="outcomes file (.json, .jsonl, .yaml)")
    build.add_argument("--task", help="only this task id")
    build.add_argument("--session", help="only this session id")
    build.add_argument("--std-scale", action="store_true", help="divide group advantages by the group std")
    build.add_argument("--leave-one-out", action="store_true", help="baseline = mean of the other rollouts")
    build.add_argument("--weight", choices=("one", "session"), default="one",
                       help="per-trajectory weight: 1, or 1/(trajectories of its session)")
    build.add_argument("--lineage-reward", choices=("inherit", "main-only"), default="inherit",
                       help="inherit: sub-agents and compaction continuations are trained with the session's "
                            "reward and advantage; main-only: only main chains (side calls: weight 0 either way)")
    build.add_argument("--missing-logprobs", choices=("fill", "refuse"), default="fill",
                       help="fill: 0.0 and flag it in metadata; refuse: stop with an error")
    build.add_argument("--no-conversation", action="store_true",
                       help="do not store the last request/response per trajectory (no SFT export)")
    build.add_argument("--skip-invalid", action="store_true", help="skip invalid record lines instead of failing")
    build.add_argument("--no-progress", action="store_true", help="never draw a progress bar")
    build.set_defaults(func=_guarded(cmd_build))

    stats = sub.add_parser("stats", help="readable summary of a trajectory file or directory",
                           description=STATS_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    stats.add_argument("file", help="a trajectory Parquet file, or a directory of parts (a batch's trajectories/)")
    stats.add_argument("--json", action="store_true", help="print one JSON object instead")
    stats.set_defaults(func=_guarded(cmd_stats))

    export = sub.add_parser("export", help="trajectory file -> slime JSONL, verl .npz or SFT JSONL",
                            description=EXPORT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    export.add_argument("file", help="a trajectory Parquet file, or a directory of parts")
    export.add_argument("--format", required=True, choices=("slime", "verl", "sft"), help="see above")
    export.add_argument("-o", "--output", required=True, help="the file to write (written whole, then renamed)")
    export.add_argument("--pad-token-id", type=int, default=0, help="verl padding id")
    export.add_argument("--min-reward", type=float,
                        help="keep only rows with at least this reward (rejection sampling; masked rows never)")
    export.add_argument("--status", action="append", choices=("completed", "timeout", "error"), default=[],
                        help="keep only rows with this status (repeatable)")
    export.set_defaults(func=_guarded(cmd_export))


STATS_HELP = """Summarize a trajectory table: trajectories, sessions, tasks and groups; statuses and how many
rows are masked (weight 0) or lack logprobs; rewards; prompt and response tokens; merge statistics (calls per
trajectory, chain starts and breaks, from the build), rewards by harness, and per session the sub-agents,
compactions and side calls (metadata.lineage) with the tokens of all rows and of the trained ones.
--json prints one object instead.

example:
  polar traj build captures -o t.parquet --rewards outcomes.yaml && polar traj stats t.parquet
"""
EXPORT_HELP = """Write a trajectory table in a trainer's format:
  slime  JSONL, one sample per row: tokens (prompt + response), response_length, loss_mask, rollout_log_probs,
         reward, status, metadata
  verl   .npz of padded arrays: prompts (left-padded), responses, input_ids, attention_mask, position_ids,
         response_mask, old_log_probs, token_level_scores (reward on the last token), rewards, advantages,
         weights, uid (group); --pad-token-id pads
  sft    JSONL of chat messages (rows built with their conversation; others are skipped and counted)
--min-reward and --status keep only the rows that pass (rejection sampling); masked rows are never exported
by --min-reward.

example:
  polar traj export runs/batches/B/trajectories --format sft --min-reward 1 -o sft.jsonl
"""


def _guarded(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Expected failures (bad input) print one line and exit 2 instead of a traceback."""
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except BrokenPipeError:  # the reader left (`| head`): polar's entry ends quietly, not a bad input
            raise
        except (ValueError, OSError) as e:
            message = " ".join(str(e).split())[:400]
            source = getattr(args, "file", None) or args.capture_dir  # pyarrow's errors do not name the file
            if source not in message:
                message = f"{source}: {message}"
            print(f"polar traj {args.traj_command}: error: {message}", file=sys.stderr)
            return 2
    return run


def _progress(enabled: bool) -> Callable[[list[Any]], Any]:
    def wrap(files: list[Any]) -> Any:
        from tqdm import tqdm

        small = not enabled or len(files) < PROGRESS_MIN_SESSIONS
        return tqdm(files, desc="sessions", unit="session", file=sys.stderr, disable=True if small else None)
    return wrap


def cmd_build(args: argparse.Namespace) -> int:
    from .build import BuildConfig
    from .outcomes import AdvantageConfig, load_outcomes
    from .pipeline import Selection, build_parquet
    from .reading import scan

    outcomes = load_outcomes(args.rewards) if args.rewards else None
    if not scan(args.capture_dir, args.task, args.session):  # an empty table would look like a finished build
        only = "".join(f" {flag} {v}" for flag, v in (("--task", args.task), ("--session", args.session)) if v)
        raise ValueError(f"no capture files (TASK/SESSION.jsonl) in {args.capture_dir}{only}: nothing written")
    result = build_parquet(
        Selection(args.capture_dir, args.task, args.session, strict=not args.skip_invalid),
        args.output,
        BuildConfig(args.strategy, args.missing_logprobs, keep_conversation=not args.no_conversation),
        outcomes,
        AdvantageConfig(std_scale=args.std_scale, leave_one_out=args.leave_one_out, weight=args.weight,
                        lineage_reward=args.lineage_reward),
        progress=_progress(not args.no_progress),
    )
    print(f"wrote {result.rows} trajectories to {result.path}")
    for line in result.stats.summary_lines():
        print(line)
    if result.stats.invalid_records:
        print(f"skipped {result.stats.invalid_records} invalid record lines", file=sys.stderr)
    if result.unmatched_outcomes:
        print(f"warning: {len(result.unmatched_outcomes)} outcome sessions have no capture file, e.g. "
              f"{result.unmatched_outcomes[:3]}", file=sys.stderr)
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    from . import analysis
    from .parquet import read

    table = read(args.file, columns=analysis.LIGHT_COLUMNS)  # no token columns: read once, small
    summary = analysis.summary(table)
    merge = analysis.merge_stats(table)
    harness = analysis.rewards_by_harness(table)
    lineage = analysis.lineage_by_session(table)
    if args.json:
        print(json.dumps({"summary": summary, "merge": json.loads(merge.to_json(orient="index")),
                          "rewards_by_harness": json.loads(harness.to_json(orient="index")),
                          "lineage_by_session": json.loads(lineage.to_json(orient="index"))}, indent=2))
        return 0
    print(f"{summary['trajectories']} trajectories, {summary['sessions']} sessions, {summary['tasks']} tasks,"
          f" {summary['groups']} groups; strategy {', '.join(summary['strategies']) or '-'}")
    print("statuses: " + (", ".join(f"{k} {v}" for k, v in summary["statuses"].items()) or "-")
          + f"; masked {summary['masked']}; logprobs incomplete {summary['logprobs_incomplete']}")
    mean = "n/a" if summary["reward_mean"] is None else f"{summary['reward_mean']:.4f}"
    print(f"rewards: {summary['rewarded']} rewarded, mean {mean}")
    print(f"tokens: prompt {summary['prompt_tokens']}, response {summary['response_tokens']}")
    if len(merge):
        print("\nmerge stats:\n" + merge.astype(object).T.to_string())
    if len(harness):
        print("\nrewards by harness:\n" + harness.to_string())
    if len(lineage):
        print("\nlineage by session (trained tokens: rows with weight > 0):\n" + lineage.to_string())
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .export import accepted, write_export
    from .parquet import read

    table = read(args.file)
    kept = accepted(table, args.min_reward, tuple(args.status))
    if args.min_reward is not None or args.status:
        print(f"accepted {kept.num_rows}/{table.num_rows} trajectories")
    result = write_export(kept, args.format, args.output, pad_token_id=args.pad_token_id)
    print(f"wrote {result.written} {args.format} records to {result.path}")
    if result.skipped:
        print(f"skipped {result.skipped} trajectories built without their conversation", file=sys.stderr)
    return 0
