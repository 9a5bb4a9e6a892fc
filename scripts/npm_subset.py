"""A package.json + package-lock.json for some of a locked npm project's dependencies: `make demo` installs only
Pi and Codex from scripts/harnesses/ (the lock of all six CLIs), at exactly the versions `make test` installs.
The lock keeps the named packages and every package they reach (dependencies, optional and peer ones), found
as node resolves them (the nearest node_modules up the path); the entries are copied unchanged, so versions
and integrity hashes stay the full lock's.

    python3 scripts/npm_subset.py SRC_DIR DST_DIR PACKAGE...
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

DEP_FIELDS = ("dependencies", "optionalDependencies", "peerDependencies")


def resolve(packages: dict[str, dict], at: str, name: str) -> str | None:
    """The lock key node finds for `name` required from the package at key `at` ("" is the root)."""
    while True:
        key = f"{at}/node_modules/{name}" if at else f"node_modules/{name}"
        if key in packages:
            return key
        if not at:
            return None
        cut = at.rfind("/node_modules/")
        at = at[:cut] if cut >= 0 else ""


def closure(packages: dict[str, dict], names: list[str]) -> list[str]:
    """The keys of the root's `names` and of everything they reach, in the lock's order."""
    seen: set[str] = set()
    todo = []
    for name in names:
        key = resolve(packages, "", name)
        if key is None:
            raise ValueError(f"{name} is not in the lock")
        todo.append(key)
    while todo:
        key = todo.pop()
        if key in seen:
            continue
        seen.add(key)
        entry = packages[key]
        optional = {**entry.get("optionalDependencies", {}), **entry.get("peerDependenciesMeta", {})}
        for field in DEP_FIELDS:
            for dep in entry.get(field, {}):
                found = resolve(packages, key, dep)
                if found is not None:
                    todo.append(found)
                elif dep not in optional:  # another platform's optional binary may be absent from the lock
                    raise ValueError(f"{key} needs {dep}, which the lock does not hold")
    return [k for k in packages if k in seen]


def subset(manifest: dict, lock: dict, names: list[str]) -> tuple[dict, dict]:
    deps = manifest["dependencies"]
    missing = [n for n in names if n not in deps]
    if missing:
        raise ValueError(f"not dependencies of {manifest.get('name')}: {', '.join(missing)}")
    pins = {n: deps[n] for n in deps if n in names}
    packages = lock["packages"]
    root = {**packages[""], "dependencies": pins}
    kept = {"": root, **{k: packages[k] for k in closure(packages, list(pins))}}
    return {**manifest, "dependencies": pins}, {**lock, "packages": kept}


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    src, dst, names = Path(argv[0]), Path(argv[1]), argv[2:]
    manifest = json.loads((src / "package.json").read_text())
    lock = json.loads((src / "package-lock.json").read_text())
    try:
        manifest, lock = subset(manifest, lock, names)
    except ValueError as e:
        print(f"npm_subset: {e}", file=sys.stderr)
        return 1
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "package.json").write_text(json.dumps(manifest, indent=2) + "\n")
    (dst / "package-lock.json").write_text(json.dumps(lock, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
