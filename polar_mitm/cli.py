"""`polar proxy`: mitmproxy with Polar's addon, two listeners (HTTPS_PROXY and base URL) on 127.0.0.1."""
from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from polar_mitm.engines import parse_backends
from polar_mitm.harness_env import harness_env, write_ca_bundle
from polar_mitm.launch import die_with_parent


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("proxy", help="run the recording proxy (mitmproxy + Polar addon)")
    p.add_argument("--tokenizer", default="fixtures/tiny-qwen2", help="model dir with tokenizer and chat template")
    p.add_argument("--backend", default="http://127.0.0.1:30000",
                   help="inference server URL; several replicas comma-separated (each session sticks to one)")
    p.add_argument("--placement", default="least_loaded", choices=["least_loaded", "round_robin"],
                   help="where a new session goes when there are several replicas (default: %(default)s)")
    p.add_argument("--engine", default="sglang", choices=["sglang", "vllm"])
    p.add_argument("--capture-dir", default="captures")
    p.add_argument("--sessions", default="open", help="'open' or a redis:// URL with registered sessions")
    p.add_argument("--host", default="127.0.0.1", help="listen address (keep it on loopback)")
    p.add_argument("--proxy-port", type=int, default=8080, help="HTTPS_PROXY listener")
    p.add_argument("--base-url-port", type=int, default=8081, help="base-URL listener (*_BASE_URL)")
    p.add_argument("--confdir", default="~/.polar/mitmproxy", help="where mitmproxy keeps its CA")
    p.add_argument("--tool-parser", default="hermes", choices=["hermes", "qwen3_coder"])
    p.add_argument("--reasoning-parser", default="think", choices=["think", "none"])
    p.add_argument("--hosts", default="", help="extra provider hostnames to intercept, comma-separated")
    p.set_defaults(func=run)


def proxy_modes(host: str, proxy_port: int, base_url_port: int, backend: str) -> list[str]:
    # mitmproxy needs a reverse target; Polar never forwards to it (polar_mitm/egress.py). The first engine.
    return [f"regular@{host}:{proxy_port}", f"reverse:{parse_backends(backend)[0]}@{host}:{base_url_port}"]


def run(args: argparse.Namespace) -> int:
    die_with_parent()  # started by a worker or `polar run`: go when it goes
    confdir = Path(args.confdir).expanduser()
    confdir.mkdir(parents=True, exist_ok=True)
    try:
        return asyncio.run(_serve(args, confdir))
    except Exception as e:  # mitmproxy raises OptionsError for bad settings, OSError for busy ports
        print(f"polar proxy: {e}", file=sys.stderr)
        return 2


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
        polar_tool_parser=args.tool_parser, polar_reasoning_parser=args.reasoning_parser,
    )
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
        print(f"polar proxy: CA certificate {ca}")
        print("polar proxy: environment for a harness (replace SESSION and TOKEN):")
        for key, value in env.items():
            print(f"  export {key}={value}")
        sys.stdout.flush()
