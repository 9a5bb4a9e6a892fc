"""Build fixtures/swe/: a small Python repository with three real bugs, each fixed by its own commit (the fix
and a test for it), kept as a git bundle (fixtures/swe/statslib.bundle), and instances.jsonl: one SWE-bench
shaped instance per fixing commit (base_commit its parent, patch its source diff, test_patch its test diff,
FAIL_TO_PASS its new tests, PASS_TO_PASS the tests that passed before and after). Deterministic: fixed authors
and dates, so the commit ids in instances.jsonl do not change when it is run again.

    .venv/bin/python scripts/make_swe_fixtures.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "fixtures" / "swe"
ENV = {**os.environ, "GIT_AUTHOR_NAME": "polar", "GIT_AUTHOR_EMAIL": "polar@localhost",
       "GIT_COMMITTER_NAME": "polar", "GIT_COMMITTER_EMAIL": "polar@localhost",
       "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
       "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}

BASE = {
    "statslib/__init__.py": "",
    "statslib/stats.py": '''def mean(xs):
    return sum(xs) // len(xs)


def median(xs):
    s = sorted(xs)
    return s[len(s) // 2]
''',
    "statslib/text.py": '''def title_words(text):
    return " ".join(w.capitalize() for w in text.split(" "))
''',
    "tests/__init__.py": "",
    "tests/test_stats.py": '''from statslib.stats import mean, median


def test_mean_of_equal_numbers():
    assert mean([2, 2, 2]) == 2


def test_median_of_odd_length():
    assert median([3, 1, 2]) == 2
''',
    "tests/test_text.py": '''from statslib.text import title_words


def test_one_word():
    assert title_words("hello") == "Hello"
''',
}

FIXES = [  # (instance, problem statement, {file: new text}, {test file: new text}, new tests)
    ("statslib-1", "mean() of [1, 2] returns 1 instead of 1.5: it must return the true average.",
     {"statslib/stats.py": BASE["statslib/stats.py"].replace("sum(xs) // len(xs)", "sum(xs) / len(xs)")},
     {"tests/test_stats.py": BASE["tests/test_stats.py"] + '''

def test_mean_is_not_rounded():
    assert mean([1, 2]) == 1.5
'''}, ["tests/test_stats.py::test_mean_is_not_rounded"]),
    ("statslib-2", "median() of a list of even length returns the upper middle element; it must return the "
                   "mean of the two middle elements.",
     {"statslib/stats.py": None},
     {"tests/test_stats.py": None}, ["tests/test_stats.py::test_median_of_even_length"]),
    ("statslib-3", "title_words() drops the spacing of text with runs of spaces and mangles words after a "
                   "newline: it must capitalize each word and keep every other character as it is.",
     {"statslib/text.py": '''import re


def title_words(text):
    return re.sub(r"\\S+", lambda m: m.group(0).capitalize(), text)
'''},
     {"tests/test_text.py": BASE["tests/test_text.py"] + '''

def test_spacing_is_kept():
    assert title_words("a  b\\nc") == "A  B\\nC"
'''}, ["tests/test_text.py::test_spacing_is_kept"]),
]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=ENV).stdout


def write(repo: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "statslib"
        repo.mkdir()
        git(repo, "init", "-q", "-b", "main")
        write(repo, BASE)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", "statslib: mean, median, title_words")
        lines = []
        for instance, problem, src, tests, new_tests in FIXES:
            stats = (repo / "statslib" / "stats.py").read_text()
            test_stats = (repo / "tests" / "test_stats.py").read_text()
            if instance == "statslib-2":  # built on the current text (after fix 1)
                src = {"statslib/stats.py": stats.replace("    return s[len(s) // 2]\n",
                                                          "    n = len(s)\n    if n % 2:\n        return s[n // 2]\n"
                                                          "    return (s[n // 2 - 1] + s[n // 2]) / 2\n")}
                tests = {"tests/test_stats.py": test_stats + '''

def test_median_of_even_length():
    assert median([4, 1, 3, 2]) == 2.5
'''}
            base = git(repo, "rev-parse", "HEAD").strip()
            before = {t.split("::")[0] for t in new_tests}
            passing = [f"{f}::{name}" for f in sorted(before) for name in _tests_in((repo / f).read_text())]
            write(repo, src)
            write(repo, tests)
            patch = git(repo, "diff", "--", *src)
            test_patch = git(repo, "diff", "--", *tests)
            git(repo, "add", "-A")
            git(repo, "commit", "-q", "-m", f"fix {instance}: {problem[:50]}")
            lines.append(json.dumps({"instance_id": instance, "repo": "statslib.bundle", "base_commit": base,
                                     "problem_statement": problem, "patch": patch, "test_patch": test_patch,
                                     "FAIL_TO_PASS": json.dumps(new_tests), "PASS_TO_PASS": json.dumps(passing)}))
        bundle = OUT / "statslib.bundle"
        git(repo, "bundle", "create", str(bundle), "main")
    (OUT / "instances.jsonl").write_text("\n".join(lines) + "\n")
    print(f"{OUT / 'instances.jsonl'}: {len(lines)} instances; {bundle} ({bundle.stat().st_size} bytes)")
    return 0


def _tests_in(text: str) -> list[str]:
    return [line[4:].split("(")[0] for line in text.splitlines() if line.startswith("def test")]


if __name__ == "__main__":
    sys.exit(main())
