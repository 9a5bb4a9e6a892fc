"""What a worker node says about itself: one line when it is up (node, queues, proxy, engines, runtime) and a
status line every POLAR_STATUS_S, written to the worker's own stderr (Celery shows only warnings by default,
and a node whose proxy or engine is wrong should say so before its first sample fails)."""
from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path
from typing import Sequence

from polar.run.services import ProxyHandle
from polar.sandbox.runtime import resolve_runtime
from polar_mitm.engines import parse_backends
from workers.settings import WorkerSettings


def say(line: str) -> None:
    """To the terminal the worker was started from (Celery redirects sys.stderr into its logger)."""
    stream = sys.__stderr__ or sys.stderr
    print(line, file=stream, flush=True)


def engine_state(url: str, timeout_s: float = 2.0) -> str:
    """`up (model NAME)`, `up`, or `down (why)`: the model name from SGLang's /get_model_info or /v1/models."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through the user's HTTP_PROXY
    why = "no answer"
    for route in ("/get_model_info", "/v1/models", "/health"):
        try:
            with opener.open(url.rstrip("/") + route, timeout=timeout_s) as reply:
                body = reply.read(1 << 20)
        except Exception as e:  # noqa: BLE001 - any failure is the state we report
            why = " ".join(str(getattr(e, "reason", e)).split())[:120]
            continue
        try:
            data = json.loads(body)
        except ValueError:
            return "up"
        names = [data.get("model_path")] if isinstance(data, dict) and "model_path" in data else \
            [m.get("root") or m.get("id") for m in data.get("data", [])] if isinstance(data, dict) else []
        names = [Path(str(n)).name for n in names if n]
        return f"up (model {names[0]})" if names else "up"
    return f"down ({why})"


def engine_states(spec: str, timeout_s: float = 2.0) -> list[str]:
    return [f"{url} {engine_state(url, timeout_s)}" for url in parse_backends(spec)]


def startup_line(settings: WorkerSettings, proxies: Sequence[ProxyHandle], queues: Sequence[str],
                 logs: Sequence[Path | None]) -> str:
    try:
        runtime = resolve_runtime(settings.runtime)
    except (ValueError, RuntimeError) as e:  # shown, not raised: the node may still serve tasks with an image
        runtime = f"{settings.runtime} ({e})"
    else:
        runtime = runtime if settings.runtime == runtime else f"{settings.runtime} -> {runtime}"
    described = "; ".join(
        f"proxy {p.host}:{p.proxy_port} (HTTPS_PROXY) and :{p.base_url_port} (base URL), "
        f"log {log or '(the running polar proxy logs where it was started)'}, captures {p.capture_dir}"
        for p, log in zip(proxies, logs))
    return (f"polar node {settings.node}: up; queues {', '.join(queues)}; {described}; "
            f"engines ({settings.engine}): {'; '.join(engine_states(settings.engine_url))}; "
            f"model {settings.model_dir}; runtime {runtime}; output {settings.output_root}")


def status_line(node: str, state: str, held: Sequence[tuple[str, str]], uptime_s: float) -> str:
    running = ", ".join(sample for _, sample in held[:4]) + (f" and {len(held) - 4} more" if len(held) > 4 else "")
    return (f"polar node {node}: {state}, {len(held)} samples held" + (f" ({running})" if held else "")
            + (f", up {uptime_s:.0f}s" if uptime_s < 120 else f", up {uptime_s / 60:.0f} min"))
