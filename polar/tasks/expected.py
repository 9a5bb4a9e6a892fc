"""The tests a task expects: pytest node ids read from the task's own test files with `ast`, never by running
them. The observer (polar/scoring/observer.py) pays only for these; the task-file reader checks each named file
holds at least one."""
from __future__ import annotations

import ast
from pathlib import Path


def expected_tests(root: Path, rel: str) -> list[str]:
    """The node ids pytest gives the tests of `root/rel` by default naming (test* functions, Test* classes'
    test* methods, nested Test* classes, unittest.TestCase subclasses), without parameters: `rel::name`."""
    tree = ast.parse((root / rel).read_bytes(), filename=rel)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    ids: list[str] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            ids.append(f"{rel}::{node.name}")
        elif isinstance(node, ast.ClassDef):
            ids += _class_tests(node, classes, f"{rel}::{node.name}")
    return ids


def _class_tests(node: ast.ClassDef, classes: dict[str, ast.ClassDef], prefix: str) -> list[str]:
    bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
    if not (node.name.startswith("Test") or "TestCase" in bases) or _not_a_test(node):
        return []
    ids, seen = [], set()
    for cls in [node, *_base_classes(node, classes)]:
        for item in cls.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith("test") \
                    and item.name not in seen:
                seen.add(item.name)
                ids.append(f"{prefix}::{item.name}")
            elif isinstance(item, ast.ClassDef) and cls is node:
                ids += _class_tests(item, classes, f"{prefix}::{item.name}")
    return ids


def _base_classes(node: ast.ClassDef, classes: dict[str, ast.ClassDef], depth: int = 0) -> list[ast.ClassDef]:
    """Bases defined in the same file, nearest first (their test methods are inherited)."""
    found = []
    for b in node.bases:
        if isinstance(b, ast.Name) and b.id in classes and classes[b.id] is not node and depth < 10:
            found += [classes[b.id], *_base_classes(classes[b.id], classes, depth + 1)]
    return found


def _not_a_test(node: ast.ClassDef) -> bool:
    """`__test__ = False`, or an __init__ (pytest skips such a class with a warning)."""
    for item in node.body:
        if isinstance(item, ast.FunctionDef) and item.name == "__init__":
            return True
        if isinstance(item, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__test__" for t in item.targets):
            return isinstance(item.value, ast.Constant) and not item.value.value
    return False
