"""`polar proxy`: mitmproxy with Polar's addon, two listeners (HTTPS_PROXY and base URL) on 127.0.0.1."""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

from polar_mitm.engines.backends import parse_backends
from polar_mitm.harness_env import harness_env, write_ca_bundle
from polar_mitm.launch import die_with_parent
from polar_mitm.tokens.gguf import model_name
from polar_mitm.tokens.reply_parser import REASONING_PARSERS, TOOL_PARSERS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("proxy", help="run the recording proxy (mitmproxy + Polar addon)", description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", help="required: the model directory (tokenizer.json + chat template, or a .gguf "
                                       "in one) of the model the engine serves; token ids are recorded with it")
    p.add_argument("--backend", default="http://127.0.0.1:30000",
                   help="inference server URL; several replicas comma-separated (each session sticks to one; "
                        "default: %(default)s)")
    p.add_argument("--placement", default="least_loaded", choices=["least_loaded", "round_robin"],
                   help="where a new session goes when there are several replicas (default: %(default)s)")
    p.add_argument("--engine", default="sglang", choices=["sglang", "vllm"],
                   help="token API of the engine: sglang (/generate) or vllm (/v1/completions); default %(default)s")
    p.add_argument("--capture-dir", default="captures", help="where CallRecords go (default: %(default)s)")
    p.add_argument("--sessions", default="open", help="'open' (any credential becomes a session: local use) or "
                                                      "the redis:// URL where sessions are registered")
    p.add_argument("--host", default="127.0.0.1", help="listen address (keep it on loopback)")
    p.add_argument("--proxy-port", type=int, default=8080, help="HTTPS_PROXY listener")
    p.add_argument("--base-url-port", type=int, default=8081, help="base-URL listener (*_BASE_URL)")
    p.add_argument("--confdir", default="~/.polar/mitmproxy", help="where mitmproxy keeps its CA")
    p.add_argument("--tool-parser", default="auto", choices=["auto", *TOOL_PARSERS, "none"],
                   help="how the model writes tool calls: auto (default) reads the family from the chat template "
                        "(docs/models.md) and refuses one not parsed yet; a name forces that form, none: text only")
    p.add_argument("--reasoning-parser", default="auto", choices=["auto", *REASONING_PARSERS, "none"],
                   help="how the model writes reasoning: auto (default: think for <think>, mistral for [THINK], "
                        "harmony for gpt-oss), or a name, or none")
    p.add_argument("--render", default="proxy", choices=["proxy", "engine"],
                   help="who renders prompts and parses replies: proxy (default: the chat template here, history "
                        "substituted, token-exact) or engine (the engine's chat API with token ids, vLLM >= 0.10.2: "
                        "any model it serves, each call rendered in full; docs/models.md)")
    p.add_argument("--hosts", default="", help="extra provider hostnames to intercept, comma-separated")
    p.add_argument("--context-length", type=int, default=0, metavar="N",
                   help="prompt + output budget in tokens (default: the one the engine reports, else the model's "
                        "config.json)")
    p.add_argument("--memory-budget", type=memory_size, default=0, metavar="SIZE",
                   help="bytes (or 512M, 1.5G) for session histories, prompt caches and capture records together; "
                        "past it the least recently used sessions' histories go and their next call is rendered in "
                        "full (default: no bound but 10,000 sessions)")
    p.add_argument("--status-file", default="", metavar="FILE",
                   help="rewrite FILE every few seconds with the proxy's pid, RSS and session memory as JSON "
                        "(worker nodes use it for `polar status`; default: none)")
    p.set_defaults(func=run)


def memory_size(text: str) -> int:
    """`1500000000`, `512M`, `1.5G` -> bytes (argparse type)."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    try:
        n = float(text[:-1]) * units[text[-1].upper()] if text and text[-1].upper() in units else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected bytes, or a number with K, M or G") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected 0 or more")
    return int(n)


DESCRIPTION = """Run the recording proxy: mitmproxy with Polar's addon on two listeners (127.0.0.1).

  HTTPS_PROXY listener (--proxy-port)  harnesses that honour HTTPS_PROXY and trust the proxy's CA
  base-URL listener (--base-url-port)  harnesses pointed at it by *_BASE_URL, the session token as API key

Every LLM call is tokenized with --tokenizer, sent to the engine's token API (--backend, --engine) and
recorded as one CallRecord line in CAPTURE_DIR/<task>/<session>.jsonl. The CA is CONFDIR/mitmproxy-ca-cert.pem;
the proxy prints it and the environment a harness needs once it listens.

example:
  polar serve --model fixtures/tiny-qwen2 --port 30000 &
  polar proxy --tokenizer fixtures/tiny-qwen2 --backend http://127.0.0.1:30000 --capture-dir captures
"""


def tokenizer_problem(path: str | Path) -> str | None:
    """Why `path` cannot be a model directory for the proxy, checked before anything starts; None when it can."""
    p = Path(path).expanduser()
    if not p.exists():
        return f"{p} does not exist"
    if p.is_file():
        return None if p.suffix == ".gguf" else f"{p} is a file, not a model directory (or a .gguf file)"
    if (p / "tokenizer.json").is_file() or (p / "tokenizer_config.json").is_file() or any(p.glob("*.gguf")):
        return None
    return f"{p} has no tokenizer.json, tokenizer_config.json or .gguf file"


ENGINE_ROUTES = ("/get_model_info", "/v1/models")  # what SGLang and vLLM say of themselves; polar serve answers both


def engine_reports(url: str, timeout_s: float = 2.0) -> dict[str, Any]:
    """An engine's answers to ENGINE_ROUTES, by route: the parsed JSON (None for an answer that is not JSON) of
    each route that answered. OSError (the last route's) when neither answers."""
    import json
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through the user's HTTP_PROXY
    reports: dict[str, Any] = {}
    last: Exception | None = None
    for route in ENGINE_ROUTES:
        try:
            with opener.open(url.rstrip("/") + route, timeout=timeout_s) as reply:
                body = reply.read(1 << 20)
        except Exception as e:  # noqa: BLE001 - a route that does not answer is tried no further
            last = e
            continue
        try:
            reports[route] = json.loads(body)
        except ValueError:
            reports[route] = None
    if not reports:
        raise OSError(" ".join(str(getattr(last, "reason", last)).split())[:120])
    return reports


def model_names(reports: dict[str, Any]) -> list[str]:
    """The model names (directory names) in an engine's reports: SGLang's model_path, else vLLM's model roots or
    ids; [] when they name none."""
    for route, pick in (("/get_model_info", lambda d: [d.get("model_path")]),
                        ("/v1/models", lambda d: [m.get("root") or m.get("id") for m in d.get("data", [])])):
        try:
            names = [model_name(Path(str(n))) for n in pick(reports[route]) if n]
        except Exception:  # noqa: BLE001 - a route that did not answer, or an answer that names nothing
            continue
        if names:
            return names
    return []


def context_length(reports: dict[str, Any]) -> int | None:
    """The context an engine's reports give (polar serve's and SGLang-style /get_model_info `max_context_length`,
    vLLM's /v1/models `max_model_len`); None when they give none. An engine started with a longer context than
    its model's config.json (`polar serve --context-length`) takes prompts the config would refuse."""
    for route, pick in (("/get_model_info", lambda d: d.get("max_context_length")),
                        ("/v1/models", lambda d: (d.get("data") or [{}])[0].get("max_model_len"))):
        try:
            value = pick(reports[route])
        except Exception:  # noqa: BLE001 - a route that did not answer, or an answer without a context
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def served_models(url: str, timeout_s: float = 2.0) -> list[str]:
    """The model names an engine reports ([] when it answers without naming one); OSError when it does not answer."""
    return model_names(engine_reports(url, timeout_s))


def first_engine(backend: str) -> str:
    """The URL of --backend's first replica; ValueError naming the flag for a bad one."""
    try:
        return parse_backends(backend)[0].rstrip("/")
    except ValueError as e:
        raise ValueError(f"--backend {backend!r}: {e}") from e


def model_mismatch(url: str, names: list[str], tokenizer: str | Path) -> str | None:
    """The warning when an engine's reported model names are not the tokenizer directory's; None when they agree
    or the engine names none."""
    path = Path(tokenizer).expanduser().resolve()
    want = model_name(path)
    if not names or want.lower() in (n.lower() for n in names):
        return None
    return (f"the engine at {url} serves {names[0]!r} but the tokenizer is {str(path)!r}: if these are "
            "different models, every recorded token id is wrong")


def engine_model_mismatch(backend: str, tokenizer: str | Path, timeout_s: float = 2.0) -> str | None:
    """A warning when the first engine names its model and the name is not the tokenizer directory's; None when
    they agree or the engine does not say. Never an error: a served alias may differ from the directory's name
    legitimately."""
    url = first_engine(backend)
    try:
        return model_mismatch(url, served_models(url, timeout_s), tokenizer)
    except OSError:  # an engine that does not answer is not this warning's business
        return None


def proxy_modes(host: str, proxy_port: int, base_url_port: int, backend: str) -> list[str]:
    # mitmproxy needs a reverse target; Polar never forwards to it (polar_mitm/gate/egress.py). The first engine.
    return [f"regular@{host}:{proxy_port}", f"reverse:{parse_backends(backend)[0]}@{host}:{base_url_port}"]


def run(args: argparse.Namespace) -> int:
    from polar_mitm.tokens.model import without_torch

    without_torch()  # this process is the proxy and nothing else
    # No silent default: ids recorded with another model's tokenizer would be wrong for every call.
    if not args.tokenizer:
        print("polar proxy: --tokenizer DIR is required: the model directory of the model the engine serves "
              "(fixtures/tiny-qwen2 for `polar serve`'s default)", file=sys.stderr)
        return 2
    if (problem := tokenizer_problem(args.tokenizer)) is not None:
        print(f"polar proxy: --tokenizer: {problem}", file=sys.stderr)
        return 2
    try:
        url = first_engine(args.backend)
    except ValueError as e:
        print(f"polar proxy: {e}", file=sys.stderr)
        return 2
    if args.context_length < 0:
        print(f"polar proxy: --context-length {args.context_length}: expected a positive number of tokens",
              file=sys.stderr)
        return 2
    try:  # asked once: the model it names (a warning when not the tokenizer's) and its context
        reports = engine_reports(url)
    except OSError:  # an engine that does not answer (yet) is no reason not to start
        reports = {}
    if (warning := model_mismatch(url, model_names(reports), args.tokenizer)) is not None:
        print(f"polar proxy: warning: {warning}", file=sys.stderr)
    if not args.context_length and (served := context_length(reports)) is not None:
        args.context_length = served
        print(f"polar proxy: context {served} tokens (the engine's)", flush=True)
    die_with_parent()  # started by a worker or `polar run`: go when it goes
    confdir = Path(args.confdir).expanduser()
    confdir.mkdir(parents=True, exist_ok=True)
    try:
        code = asyncio.run(_serve(args, confdir))
    except Exception as e:  # mitmproxy raises OptionsError for bad settings, OSError for busy ports
        print(f"polar proxy: {e}", file=sys.stderr)
        return 2
    # Stopped: the addons' done() closed what they hold. The interpreter's own teardown (the tokenizer, mitmproxy)
    # would take another second of every stop.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


async def _serve(args: argparse.Namespace, confdir: Path) -> int:
    from mitmproxy.options import Options
    from mitmproxy.tools.dump import DumpMaster

    from polar_mitm.addon import addons

    opts = Options(confdir=str(confdir))
    master = DumpMaster(opts, with_termlog=True, with_dumper=False)
    master.addons.add(*addons, _Announce(args, confdir, addons[0].router))
    opts.update(
        connection_strategy="lazy",
        mode=proxy_modes(args.host, args.proxy_port, args.base_url_port, args.backend),
        polar_backend=args.backend, polar_engine=args.engine, polar_engine_placement=args.placement,
        polar_tokenizer=args.tokenizer,
        polar_capture_dir=args.capture_dir, polar_sessions=args.sessions, polar_hosts=args.hosts,
        polar_tool_parser=args.tool_parser, polar_reasoning_parser=args.reasoning_parser, polar_render=args.render,
        polar_context_length=args.context_length, polar_memory_budget=args.memory_budget,
        polar_status_file=args.status_file,
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):  # as mitmdump does: a stop runs the addons' done() (status file)
        loop.add_signal_handler(sig, master.shutdown)
    await master.run()
    return 0


class _Announce:
    """Prints where to point a harness once the listeners are up (the CA exists by then)."""

    def __init__(self, args: argparse.Namespace, confdir: Path, router) -> None:
        self.args, self.confdir, self.router = args, confdir, router

    def running(self) -> None:
        ca = self.confdir / "mitmproxy-ca-cert.pem"
        bundle = write_ca_bundle(ca, self.confdir / "polar-ca-bundle.pem")
        env = harness_env(self.args.host, self.args.proxy_port, self.args.base_url_port, ca, bundle)
        print(f"polar proxy: HTTPS_PROXY listener {self.args.host}:{self.args.proxy_port}, "
              f"base-URL listener {self.args.host}:{self.args.base_url_port}")
        for replica in self.router.engines.pool.replicas:
            print(f"polar proxy: engine {replica.url} {replica.state}")
        if self.router.formats:  # the formats read from the chat template: never a silent default
            print(f"polar proxy: {self.router.formats}")
        print(f"polar proxy: CA certificate {ca}")
        print("polar proxy: environment for a harness (replace SESSION and TOKEN):")
        for key, value in env.items():
            print(f"  export {key}={value}")
        sys.stdout.flush()
