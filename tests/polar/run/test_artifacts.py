"""polar/run/artifacts.py: a task's artifacts kept from the agent's final workspace, under their names, never
through a link on the way, within the size budget."""
from __future__ import annotations

import os

from polar.run.artifacts import keep_artifacts


def test_artifacts_are_kept_under_their_names(tmp_path):
    workspace, dest, outside = tmp_path / "workspace", tmp_path / "artifacts", tmp_path / "outside"
    (workspace / "out").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret").write_text("host\n")
    (workspace / "out" / "a.json").write_text("{}\n")
    (workspace / "notes.md").write_text("n\n")
    (workspace / "via").symlink_to(outside)  # the agent's link: nothing is read through it
    kept = keep_artifacts(workspace, [("out/a.json", "out/a.json"), (".", "candidate"), ("notes.md", "n/notes.md"),
                                      ("via/secret", "secret"), ("gone.txt", "gone.txt")], dest)
    assert kept == ["out/a.json", ". -> candidate", "notes.md -> n/notes.md", "via/secret -> secret: not kept "
                    "(a link on its way)", "gone.txt: not there"]
    assert (dest / "out" / "a.json").read_text() == "{}\n" and (dest / "n" / "notes.md").read_text() == "n\n"
    assert (dest / "candidate" / "notes.md").read_text() == "n\n" and (dest / "candidate" / "via").is_symlink()
    assert not (dest / "secret").exists() and sorted(os.listdir(outside)) == ["secret"]
