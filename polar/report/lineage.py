"""The report's lineage section: per session, its trajectories as a tree (main chain, the sub-agents its tool
calls started, continuations after a compaction, side calls), from metadata.lineage (polar_traj/lineage.py)."""
from __future__ import annotations

from html import escape
from typing import Any

from polar.report.data import ReportData
from polar.report.sections import note, section

MAX_SESSIONS = 50  # trees drawn; a large batch lists the rest as a count


def lineage_tree(d: ReportData) -> str:
    df = d.trajectories
    if df.empty or "meta" not in df:
        return section("lineage", "Lineage", [note("No trajectories.")])
    sessions = list(dict.fromkeys(df["session_id"]))
    body = [note("Per session: the main chain, the sub-agents its tool calls started, continuations after a "
                 "compaction (segment n) and side calls (weight 0 by default).")]
    for sid in sessions[:MAX_SESSIONS]:
        rows = [_node(r) for _, r in df[df["session_id"] == sid].iterrows()]
        counts = {role: sum(n["role"] == role for n in rows)
                  for role in ("subagent", "compaction_continuation", "side_call")}
        body.append(f'<details open><summary>{escape(sid)}: {len(rows)} trajectories; sub-agents '
                    f'{counts["subagent"]}, compactions {counts["compaction_continuation"]}, side calls '
                    f'{counts["side_call"]}</summary>{_tree(rows)}</details>')
    if len(sessions) > MAX_SESSIONS:
        body.append(note(f"{len(sessions) - MAX_SESSIONS} more sessions not drawn."))
    return section("lineage", "Lineage: sub-agents, compactions and side calls", body)


def _node(row: Any) -> dict[str, Any]:
    lin = row["meta"].get("lineage") or {}
    return {"id": row["trajectory_id"], "role": lin.get("role", "main"), "parent": lin.get("parent_trajectory_id"),
            "tool_call_id": lin.get("tool_call_id"), "segment": lin.get("segment", 0),
            "summary": lin.get("compaction_summary", False), "calls": int(row["num_calls"]),
            "tokens": int(row["prompt_len"] + row["response_len"]), "weight": float(row["weight"])}


def _tree(nodes: list[dict[str, Any]]) -> str:
    ids = {n["id"] for n in nodes}
    children: dict[str | None, list[dict[str, Any]]] = {}
    for n in nodes:
        children.setdefault(n["parent"] if n["parent"] in ids else None, []).append(n)

    def render(parent: str | None, depth: int) -> str:
        items = children.get(parent, [])
        if not items or depth > 20:
            return ""
        return "<ul>" + "".join(f"<li>{_label(n)}{render(n['id'], depth + 1)}</li>" for n in items) + "</ul>"
    return render(None, 0)


def _label(n: dict[str, Any]) -> str:
    extra = []
    if n["tool_call_id"]:
        extra.append(f"tool call {n['tool_call_id']}")
    if n["role"] == "compaction_continuation" or n["segment"]:
        extra.append(f"segment {n['segment']}")
    if n["summary"]:
        extra.append("summarising call")
    tail = f" ({', '.join(extra)})" if extra else ""
    return (f'<b>{escape(n["role"])}</b> <code>{escape(n["id"])}</code>: {n["calls"]} calls, {n["tokens"]:,} tokens, '
            f'weight {n["weight"]:g}{escape(tail)}')
