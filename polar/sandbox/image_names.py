"""How tasks name their images, and what this node calls them.

- Docker Hub's short names are qualified as Docker qualifies them: `alexgshaw/fix-git:20260403` is
  `docker.io/alexgshaw/fix-git:20260403`, `python:3.13-slim-bookworm` is `docker.io/library/python:3.13-slim-bookworm`
  (podman refuses to pull a short name; a name whose first part has a `.` or `:`, or is `localhost`, already
  names its registry).
- The operator's map, for nodes that cannot reach Docker Hub: POLAR_IMAGE_MAP holds `NAME=REF` pairs separated by
  commas or newlines, or `@FILE` for a file of such lines (`#` starts a comment); a task's image or a Dockerfile's
  base image found there (by its name as written or qualified) is taken from REF instead.
"""
from __future__ import annotations

import os
from pathlib import Path

MAP_ENV = "POLAR_IMAGE_MAP"


def qualified(ref: str) -> str:
    """`ref` with its registry, as `docker pull` reads a short name."""
    first, slash, _rest = ref.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return ref
    return f"docker.io/{ref}" if slash else f"docker.io/library/{ref}"


def image_map(value: str | None = None) -> dict[str, str]:
    """The operator's map (POLAR_IMAGE_MAP unless `value` is given): name -> reference; ValueError naming a bad
    entry or an unreadable file."""
    text = os.environ.get(MAP_ENV, "") if value is None else value
    if text.startswith("@"):
        try:
            text = Path(text[1:]).expanduser().read_text()
        except OSError as e:
            raise ValueError(f"{MAP_ENV}={text}: cannot read the map: {e}") from None
    table: dict[str, str] = {}
    for entry in text.replace(",", "\n").splitlines():
        entry = entry.split("#", 1)[0].strip()
        if not entry:
            continue
        name, eq, ref = (part.strip() for part in entry.partition("="))
        if not eq or not name or not ref:
            raise ValueError(f"{MAP_ENV}: {entry!r}: expected NAME=REF")
        table[name] = ref
    return table


def mapped(ref: str, table: dict[str, str]) -> str | None:
    """The operator's reference for `ref`, by its name as written or qualified; None when the map has neither."""
    return table.get(ref) or table.get(qualified(ref))
