"""What a worker node says about itself: one line when it is up (node, queues, proxy, engines, runtime) and a
status line every POLAR_STATUS_S, written to the worker's own stderr (Celery shows only warnings by default,
and a node whose proxy or engine is wrong should say so before its first sample fails)."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Sequence

from polar.sandbox.runtime import resolve_runtime
from polar_mitm.cli import model_mismatch, served_models
from polar_mitm.engines.backends import parse_backends
from polar_mitm.launch import ProxyProcess
from workers.liveness import proxies_line
from workers.settings import WorkerSettings


def say(line: str) -> None:
    """To the terminal the worker was started from (Celery redirects sys.stderr into its logger)."""
    stream = sys.__stderr__ or sys.stderr
    print(line, file=stream, flush=True)


def engine_lines(settings: WorkerSettings, timeout_s: float = 2.0) -> tuple[list[str], list[str]]:
    """Each replica's state (`URL up (model NAME)`, `URL up`, `URL down (why)`), probed once, and the warnings of
    replicas naming another model than the node's tokenizer."""
    states, warnings = [], []
    for url in parse_backends(settings.engine_url):
        try:
            names = served_models(url, timeout_s)
        except OSError as e:
            states.append(f"{url} down ({e})")
            continue
        states.append(f"{url} up (model {names[0]})" if names else f"{url} up")
        if (warning := model_mismatch(url, names, settings.model_dir)) is not None:
            warnings.append(warning)
    return states, warnings


def engines_when_up(settings: WorkerSettings, wait_s: float) -> tuple[list[str], list[str]]:
    """engine_lines once some replica answers, probing for up to `wait_s` (an engine starting beside the node);
    RuntimeError naming each replica's state when none does: such a node could only fail the samples it took."""
    deadline = time.monotonic() + wait_s
    while True:
        states, warnings = engine_lines(settings)
        if any(" down (" not in state for state in states):
            return states, warnings
        if time.monotonic() >= deadline:
            raise RuntimeError(f"no inference engine answers after {wait_s:g}s (POLAR_ENGINE_URL): "
                               + "; ".join(states))
        time.sleep(1.0)


def startup_line(settings: WorkerSettings, proxies: Sequence[ProxyProcess], queues: Sequence[str],
                 logs: Sequence[Path | None], engines: Sequence[str]) -> str:
    try:
        runtime = resolve_runtime(settings.runtime)
    except (ValueError, RuntimeError) as e:  # shown, not raised: the node may still serve tasks with an image
        runtime = f"{settings.runtime} ({e})"
    else:
        # auto picks per task: what it gives a task without an image, and that a task's image picks its own
        runtime = runtime if settings.runtime == runtime else \
            f"{settings.runtime} ({runtime} for tasks without an image; docker or apptainer for a task's image)"
    described = "; ".join(
        f"proxy {p.host}:{p.proxy_port} (HTTPS_PROXY) and :{p.base_url_port} (base URL), "
        f"log {log or '(the running polar proxy logs where it was started)'}, captures {p.capture_dir}"
        for p, log in zip(proxies, logs))
    return (f"polar node {settings.node}: up; queues {', '.join(queues)}; {described}; "
            f"engines ({settings.engine}): {'; '.join(engines)}; "
            f"model {settings.model_dir}; runtime {runtime}; output {settings.output_root}")


def status_line(node: str, state: str, held: Sequence[tuple[str, str]], uptime_s: float,
                proxies: Sequence[dict[str, Any]] = ()) -> str:
    running = ", ".join(sample for _, sample in held[:4]) + (f" and {len(held) - 4} more" if len(held) > 4 else "")
    return (f"polar node {node}: {state}, {len(held)} samples held" + (f" ({running})" if held else "")
            + (f", up {uptime_s:.0f}s" if uptime_s < 120 else f", up {uptime_s / 60:.0f} min")
            + (f"; {proxies_line(proxies)}" if proxies else ""))
