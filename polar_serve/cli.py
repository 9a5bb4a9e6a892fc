"""`polar serve`: the CPU reference inference server (SGLang /generate + vLLM /v1/completions token APIs)."""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from polar_serve.policy import Policy, load_policy  # light: PyYAML only
from polar_serve.reply_formats import REPLY_FORMATS

DEFAULT_PORT = 30000
DEFAULT_PREFIX_CACHE_MB = 512  # polar_serve.engine's default too (not imported here: the CLI must stay light)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="run the reference inference server", description=__doc__)
    p.add_argument("--model", required=True, type=Path,
                   help="local model directory (transformers format), or a .gguf file (its weights dequantized to "
                        "float32 at load)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=port, default=DEFAULT_PORT, help="port; 0 picks a free one (default: %(default)s)")
    p.add_argument("--policy", type=Path, help="scripted policy YAML (docs/reference-server.md)")
    p.add_argument("--reply-format", choices=REPLY_FORMATS, default="hermes",
                   help="how the policy's replies write reasoning and tool calls: the family of the model served "
                        "(polar_serve/reply_formats.py; default: %(default)s, Qwen's)")
    p.add_argument("--served-model-name", help="model name in vLLM responses (default: the directory name)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: %(default)s)")
    p.add_argument("--incremental-streaming-output", action="store_true",
                   help="SGLang streaming chunks carry only new tokens (default: cumulative, as SGLang)")
    p.add_argument("--prefix-cache-mb", type=_non_negative, default=DEFAULT_PREFIX_CACHE_MB,
                   help="memory for the prefix cache of KV states (least recently used entries are dropped); "
                        "0 turns it off (default: %(default)s)")
    p.add_argument("--context-length", type=_context_length, default=0, metavar="N",
                   help="longest prompt + reply in tokens; a RoPE model takes any position, so a small model can "
                        "serve the long prompts of Codex or Claude Code (about 18k tokens): 65536, as `polar run` "
                        "uses (default: the model's own max_position_embeddings)")
    p.add_argument("--step-delay-ms", type=_non_negative, default=0.0,
                   help="for benchmarks and load-balancing tests: pause this long after every produced token, "
                        "to make the server slow on purpose; other requests keep running (default: 0)")
    p.set_defaults(func=run)


def port(text: str) -> int:
    """A TCP port, 0 to 65535 (also `polar api`'s: one above it was an `OverflowError: bind()` traceback)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535, got {value}")
    return value


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number, 0 or more, got {text}")
    return value


def _context_length(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number of tokens (0: the model's own), got {text!r}")
    return int(text)


async def _serve(args: argparse.Namespace, policy: Policy | None) -> None:
    import torch
    from aiohttp import web

    from polar_serve.engine import Engine
    from polar_serve.server import ReferenceServer, ServerOptions

    torch.set_num_threads(max(1, args.threads))
    engine = Engine(args.model, prefix_cache_mb=args.prefix_cache_mb, context_length=args.context_length)
    model_dir = args.model.resolve().parent if args.model.suffix == ".gguf" else args.model.resolve()
    options = ServerOptions(served_model_name=args.served_model_name or model_dir.name,  # the proxy's name too
                            incremental_streaming_output=args.incremental_streaming_output,
                            step_delay_s=args.step_delay_ms / 1000, reply_format=args.reply_format)
    runner = web.AppRunner(ReferenceServer(engine, policy, options).app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    host, port = runner.addresses[0][:2]
    # Tests and scripts read this line to learn the port (useful with --port 0).
    print(f"polar serve: listening on http://{host}:{port} (model {args.model}, "
          f"policy {args.policy or 'none'}, context {engine.max_context_length} tokens)", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


SERVE_EXTRA = "pip install 'polar[serve]'"


def missing_torch() -> str | None:
    """Why the server cannot start without PyTorch (left out of a plain `pip install polar`), or None."""
    try:
        import torch  # noqa: F401
        import safetensors  # noqa: F401
    except ImportError as e:
        return (f"polar serve: the reference server needs PyTorch and safetensors ({e}); a plain "
                f"`pip install polar` leaves them out. Install the extra: {SERVE_EXTRA} (make setup does)")
    return None


def run(args: argparse.Namespace) -> int:
    problem = missing_torch()
    if problem:
        print(problem, file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        stream=sys.stderr)
    if args.model.suffix == ".gguf" and not args.model.is_file():
        print(f"polar serve: {args.model}: no such file", file=sys.stderr)
        return 2
    if args.model.suffix != ".gguf" and not (args.model / "config.json").is_file():
        print(f"polar serve: {args.model} is not a model directory (no config.json) or a .gguf file", file=sys.stderr)
        return 2
    try:
        policy = load_policy(args.policy) if args.policy else None
    except (OSError, ValueError) as e:  # fail before the slow model load
        print(f"polar serve: bad --policy: {e}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_serve(args, policy))
    except OSError as e:
        print(f"polar serve: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0
