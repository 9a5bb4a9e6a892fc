"""`polar run --task FILE [--task-id ID]`: one scored sample of a task (polar.run.sample.run_sample), printed as the
run summary plus status, reward and the evaluator's output; trajectories.parquet in the sample folder."""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import uuid
from pathlib import Path

from polar.harness.adapters import AdapterError, load_adapter
from polar.run.sample import SampleResult


def run_task(args: argparse.Namespace) -> int:
    from polar.run.cli import reused_proxy
    from polar.run.session import EngineConfig
    from polar.run.sample import SampleConfig, run_sample
    from polar.run.services import ServiceError
    from polar.tasks.spec import TaskError, load_tasks, select_task

    if args.instruction or args.workdir:
        print("polar run: --instruction and --workdir come from the task file with --task", file=sys.stderr)
        return 2
    try:
        task = select_task(load_tasks(args.task), args.task_id, args.task)
        if args.image:
            image = args.image if args.image == "host" else str(Path(args.image).resolve())
            task = dataclasses.replace(task, image=image)
        adapter_name = args.adapter or task.adapter
        if not adapter_name:
            raise ValueError(f"task {task.task_id} names no adapter: pass --adapter")
        spec = load_adapter(adapter_name)
        proxy = reused_proxy(args)
    except (TaskError, AdapterError, ValueError) as e:
        print(f"polar run: {e}", file=sys.stderr)
        return 2
    sample_id = f"{task.task_id}-{uuid.uuid4().hex[:8]}"[-128:]
    out = (args.out or Path("runs") / f"{task.task_id}-{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    cfg = SampleConfig(task, spec, out, sample_id, task.task_id, args.runtime, args.via, args.model_name,
                       confdir=args.confdir.expanduser())
    engine = EngineConfig(args.model.resolve(), args.backend, args.engine,
                          args.policy.resolve() if args.policy else None, args.context_length)
    try:
        result = run_sample(cfg, engine, proxy)
    except (ServiceError, ValueError, OSError) as e:
        print(f"polar run: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: run_sample stopped the sandbox and ended the session
        print(f"polar run: interrupted ({e or 'SIGINT'}); sandbox stopped, sample folder {out}", file=sys.stderr)
        return 130
    t = result.timings
    print(f"polar run: task {task.task_id}, {spec.name} via {args.via} ({result.runtime}): "
          f"{result.calls} calls, prepare {t.get('prepare_s', 0):.1f}s, harness {t.get('run_s', 0):.1f}s, "
          f"evaluate {t.get('evaluate_s', 0):.1f}s")
    for line in outcome_summary(result):
        print(f"  {line}")
    print(f"  trajectories: {result.trajectories or 'none (no LLM call recorded)'}")
    print(f"  sample folder: {out}")
    return 0 if result.status == "completed" else 124 if result.status == "timeout" else 1


def outcome_summary(result: SampleResult) -> list[str]:
    reward = "none" if result.reward is None else f"{result.reward:g}"
    lines = [f"status {result.status}" + (f" ({result.failure})" if result.failure else "") +
             f", reward {reward}, weight {result.weight:g}, harness exit {result.exit_code}"]
    if result.reason:
        lines.append(f"reason: {result.reason}")
    if result.evaluator_output.strip():
        lines.append("evaluator output:")
        lines += [f"  {line}" for line in result.evaluator_output.strip().splitlines()[-15:]]
    return lines

