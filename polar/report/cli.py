"""`polar report RUN_OR_PARQUET [-o report.html]`: one self-contained HTML page of a run or a batch (or of a
`polar train` run: reward, importance ratio and staleness per step).

Sections: batch header, status and failure reasons, reward per task and harness, group spread and
advantages, per-call latency and tokens, trainer tokens per_request vs prefix_merge, chain starts and
breaks, stage timings, a sortable sample table and a token view of any trajectory. Plots are inline SVG;
the page loads nothing from the network (its Content-Security-Policy forbids it).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from polar_traj import atomic

DEFAULT_TOKEN_VIEWS = 200


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="draw a run or batch as one self-contained HTML page", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", type=Path, help="a `polar run` folder, a batch folder, a `polar train` folder, or a Parquet "
                                                "file/directory")
    p.add_argument("-o", "--out", type=Path, help="HTML file to write (default: SOURCE/report.html, or "
                                                  "report.html beside a Parquet file)")
    p.add_argument("--tokenizer", type=Path, help="model directory to decode tokens with (default: the run's)")
    p.add_argument("--max-token-views", type=int, default=DEFAULT_TOKEN_VIEWS,
                   help="trajectories embedded in the token view")
    p.set_defaults(func=run)


def default_out(source: Path) -> Path:
    return source / "report.html" if source.is_dir() else source.with_name("report.html")


def render_report(source: str | os.PathLike, tokenizer: str | os.PathLike | None = None,
                  max_token_views: int = DEFAULT_TOKEN_VIEWS) -> str:
    from polar.report.data import load
    from polar.report.lineage import lineage_tree
    from polar.report.page import page, token_payload, token_section
    from polar.report.sections import SECTIONS, footer
    from polar.report.tokens import load_decode

    data = load(source, tokenizer)
    decode = load_decode(data.layout.tokenizer) if data.layout.tokenizer else None
    payload = token_payload(data, decode, max_token_views)
    sections = [s(data) for s in SECTIONS]
    sections.append(lineage_tree(data))
    sections.append(token_section(payload, len(data.trajectories), decode is not None))
    title = f"Polar report: {data.layout.root.resolve().name}"
    return page(title, sections, payload, footer(data))


def write_report(source: str | os.PathLike, out: str | os.PathLike, tokenizer: str | os.PathLike | None = None,
                 max_token_views: int = DEFAULT_TOKEN_VIEWS) -> Path:
    """Render and write atomically (temp name in the same folder, then rename). A `polar train` run folder gets
    its training page (polar/report/training.py)."""
    from polar.report.training import is_train_run, render_training

    html = render_training(Path(source)) if is_train_run(Path(source)) else \
        render_report(source, tokenizer, max_token_views)
    return atomic.write_text(out, html, mode=0o644)


def run(args: argparse.Namespace) -> int:
    from polar.report.data import ReportError

    if args.max_token_views < 0:
        print("polar report: --max-token-views must be >= 0", file=sys.stderr)
        return 2
    if args.tokenizer is not None and not (args.tokenizer / "tokenizer.json").is_file() \
            and not (args.tokenizer / "tokenizer_config.json").is_file():
        print(f"polar report: --tokenizer {args.tokenizer}: no tokenizer.json there", file=sys.stderr)
        return 2
    out = args.out or default_out(args.source)
    try:
        written = write_report(args.source, out, args.tokenizer, args.max_token_views)
    except (ReportError, OSError) as e:
        print(f"polar report: {e}", file=sys.stderr)
        return 2
    print(f"polar report: wrote {written} ({written.stat().st_size / 1024:.0f} KB)")
    return 0
