"""Sandbox start and teardown per runtime on this machine: start-to-first-exec (prepare a sandbox, then one exec
of `true` through the in-sandbox forwarder, with the per-sandbox cgroup made and removed) and teardown (stop),
median of N each, and the ratio to the same command run on the host in the same run (the forwarder's python
start included there too). Apptainer runs an instance of the demo task image (scripts/build_image.sh), docker a
container of it (podman or docker, polar/sandbox/docker.py; its exec includes killing what the exec left).

    .venv/bin/python bench/sandbox.py [--runs 20]

--workspace: a sample's workspace preparation for an image task (fixtures/tbench/word-count, its files in the
image's /app; issue 43), median of N: before (the image's name from the engine, an empty workspace: what
prepare did until the image's workdir was seeded), seeded (polar/tasks/image_task.py from a warm cache: the
image inspected, its /app files copied into the workspace) and seeded on a disk quota (polar/sandbox/quota.py:
the disk made and bound, then unmounted with the files copied back, as postrun does).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from polar.sandbox.limits import mechanism  # noqa: E402
from polar_mitm.launch import free_port  # noqa: E402
from polar.sandbox.runtime import REGISTRY, Mounts, bridged, get_runtime, run_group  # noqa: E402

IMAGE = ROOT / ".cache" / "images" / "polar-tasks" / "rootfs"
IMAGED = ("apptainer", "docker")  # runtimes that run the task image


def measure(runtime: str | None, mounts: Mounts, runs: int) -> tuple[float, float]:
    """(median start-to-first-exec, median teardown) in seconds."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(mounts.home)}
    out, err = mounts.shared / "out", mounts.shared / "err"
    forwards = [(free_port(), mounts.shared / "bench.sock")]  # the forwarder listens as for a harness
    starts, stops = [], []
    for _ in range(runs):
        start = time.monotonic()
        if runtime is None:
            result = run_group(bridged(["true"], forwards), env, mounts.workspace, 60, out, err, limits=None)
            box = None
        else:
            rt = get_runtime(runtime)
            box = rt.prepare(mounts, image=str(IMAGE)) if runtime in IMAGED else rt.prepare(mounts)
            result = box.exec(["true"], env, mounts.workspace, 60, out, err, forwards)
        starts.append(time.monotonic() - start)
        start = time.monotonic()
        if box is not None:
            box.stop()
        stops.append(time.monotonic() - start)
        if result.exit_code != 0:
            raise SystemExit(f"{runtime}: exit {result.exit_code}: {err.read_text()[-500:]}")
    return statistics.median(starts), statistics.median(stops)


def workspace_prep(runs: int) -> int:
    import shutil

    from polar.sandbox import quota
    from polar.sandbox.docker import find_engine, image_ref
    from polar.tasks.workspace import pristine
    from polar.tasks.image_task import resolve_image_task
    from polar.tasks.load import load_tasks

    task = load_tasks(ROOT / "fixtures" / "tbench" / "word-count")[0]
    engine = find_engine()
    resolve_image_task(task, "docker")  # the cache warm: what every sample after a node's first one sees

    def before(out: Path) -> None:
        image_ref(engine, task.image)
        (out / "workspace").mkdir(parents=True)

    def seeded(out: Path) -> None:
        pristine(resolve_image_task(task, "docker").workspace, out / "workspace")

    def on_disk(out: Path) -> None:
        binds = (("home", out / "home"), ("workspace", out / "workspace"))
        quota.make_disk(out / quota.DISK, quota.quota_mb(None) or quota.DEFAULT_MB, binds)
        seeded_task = resolve_image_task(task, "docker")
        pristine(seeded_task.workspace, out / "workspace")
        quota.remove_disk(out / quota.DISK, binds)

    why = quota.unavailable()
    print(f"workspace preparation of {task.task_id} (docker, {engine.kind}); median of {runs}")
    base = None
    for label, step in (("before: empty workspace", before), ("seeded from the image", seeded),
                        ("seeded, on a disk quota", on_disk)):
        if step is on_disk and why:
            print(f"{label:28} skipped: {why}")
            continue
        times = []
        for _ in range(runs):
            with tempfile.TemporaryDirectory() as tmp:
                start = time.monotonic()
                step(Path(tmp))
                times.append(time.monotonic() - start)
                shutil.rmtree(tmp, ignore_errors=True)
        median = statistics.median(times)
        base = base or median
        print(f"{label:28} {median * 1000:8.1f} ms  {median / base:5.2f}x before")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--workspace", action="store_true", help="an image task's workspace preparation instead")
    args = ap.parse_args()
    if args.workspace:
        return workspace_prep(args.runs)
    with tempfile.TemporaryDirectory() as tmp:
        mounts = Mounts(Path(tmp) / "home", Path(tmp) / "workspace", Path(tmp) / "sandbox")
        for d in (mounts.home, mounts.workspace, mounts.shared):
            d.mkdir()
        base, _ = measure(None, mounts, args.runs)
        print(f"limits: {mechanism()}; median of {args.runs}")
        print(f"{'runtime':20} {'start-to-first-exec':>20} {'teardown':>10}")
        print(f"{'host (no sandbox)':20} {base * 1000:17.1f} ms {'-':>10}")
        for name in REGISTRY:
            if name in IMAGED and not (IMAGE / "usr" / "bin" / "python3").exists():
                print(f"{name:20} skipped: no demo image at {IMAGE} (scripts/build_image.sh)")
                continue
            label = name
            if name == "docker":
                from polar.sandbox.docker import find_engine
                from polar.sandbox.runtime import SandboxError

                try:
                    label = f"docker ({find_engine().kind})"
                except SandboxError as e:
                    print(f"{name:20} skipped: {e}")
                    continue
            first, stop = measure(name, mounts, args.runs)
            print(f"{label:20} {first * 1000:17.1f} ms {stop * 1000:7.1f} ms  {first / base:6.2f}x host")
    return 0


if __name__ == "__main__":
    sys.exit(main())
