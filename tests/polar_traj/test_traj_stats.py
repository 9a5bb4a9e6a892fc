"""stats.py: batch merge statistics add up and read back."""
from __future__ import annotations

from polar_traj.stats import MergeStats


def test_add_to_dict_from_dict_and_summary():
    a = MergeStats(strategy="prefix_merge", sessions=1, calls=5, trajectories=2, calls_merged=3,
                   per_request_tokens=100, trajectory_tokens=40, trained_tokens=10)
    a.starts["new"] += 1
    a.breaks["template"] += 1
    b = MergeStats(sessions=2, calls=3, trajectories=3, per_request_tokens=30, trajectory_tokens=30, error_calls=1)
    b.breaks["content"] += 2
    total = MergeStats()
    total.add(a)
    total.add(b)
    assert (total.strategy, total.sessions, total.calls, total.trajectories, total.error_calls) == (
        "prefix_merge", 3, 8, 5, 1)
    assert total.breaks == {"template": 1, "content": 2, "compaction": 0, "retokenized": 0}
    data = total.to_dict()
    assert data["tokens_saved"] == 60 and data["token_ratio"] == 130 / 70
    assert MergeStats.from_dict(data) == total
    text = "\n".join(total.summary_lines())
    assert "8 calls -> 5 trajectories" in text and "template 1, content 2" in text and "saved 60 (1.86x)" in text
    assert MergeStats().token_ratio is None
