"""Trajectory table -> what trainers take: slime Sample-shaped dicts, a verl-style padded numpy batch,
and SFT messages (the conversation as the harness saw it).

slime (JSONL, one Sample-shaped object per line): tokens = prompt + response, response_length,
  loss_mask and rollout_log_probs over the response (rollout_log_probs is null when some call had no
  logprobs), reward, status (completed | truncated: the last turn hit the length limit or the agent timed
  out | aborted: infrastructure error), group_index, index, prompt (messages before the first assistant
  turn, when the conversation was kept), metadata.
verl (.npz): prompts [B, P] left-padded, responses [B, R] right-padded, input_ids = prompts ‖ responses,
  attention_mask, position_ids, response_mask (= loss_mask; 0 on tool/template tokens and padding),
  old_log_probs [B, R] (the behaviour logprobs), token_level_scores [B, R] (reward on the last response
  token), rewards / advantages [B] (NaN when null), weights [B], logprobs_complete [B], uid (group_id)
  and trajectory_id [B] as unicode arrays (np.load needs no pickle).
sft (JSONL): {trajectory_id, task_id, session_id, api, messages, tools, reward, status}; rows built
  without their conversation are skipped and counted.
accepted(table, min_reward, statuses) keeps only some rows first (rejection sampling: `--format sft
  --min-reward 1` turns a batch into an SFT set of its successes).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

from . import atomic
from .messages import conversation_messages

FORMATS = ("slime", "verl", "sft")


@dataclass(frozen=True)
class ExportResult:
    path: Path
    written: int
    skipped: int = 0


def accepted(table: pa.Table, min_reward: float | None = None, statuses: tuple[str, ...] = ()) -> pa.Table:
    """The rows whose reward is at least `min_reward` (a null reward never is) and whose status is one of
    `statuses` (any when empty); masked rows (weight 0) are never accepted when filtering by reward."""
    import pyarrow.compute as pc

    keep: Any = None
    if min_reward is not None:
        keep = pc.and_(pc.fill_null(pc.greater_equal(table["reward"], min_reward), False),
                       pc.greater(table["weight"], 0))
    if statuses:
        by_status = pc.is_in(table["status"], value_set=pa.array(list(statuses)))
        keep = by_status if keep is None else pc.and_(keep, by_status)
    return table if keep is None else table.filter(keep)


def _rows(table: pa.Table) -> Iterator[dict[str, Any]]:
    for batch in table.to_batches(max_chunksize=256):
        yield from batch.to_pylist()


def slime_status(row: dict[str, Any], meta: dict[str, Any]) -> str:
    if row["status"] == "error":
        return "aborted"
    if row["status"] == "timeout" or meta.get("ends_truncated"):
        return "truncated"
    return "completed"


def slime_samples(table: pa.Table) -> Iterator[dict[str, Any]]:
    groups: dict[str, int] = {}
    for index, row in enumerate(_rows(table)):
        meta = json.loads(row["metadata"])
        conversation = meta.pop("conversation", None)
        prompt: Any = ""
        if conversation:
            messages = conversation_messages(conversation["api"], conversation["request"], None)["messages"]
            first_assistant = next((n for n, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
            prompt = messages[:first_assistant]
        yield {
            "index": index,
            "group_index": groups.setdefault(row["group_id"], len(groups)),
            "prompt": prompt,
            "tokens": row["prompt_ids"] + row["response_ids"],
            "response": "",
            "response_length": row["response_len"],
            "label": None,
            "reward": row["reward"],
            "loss_mask": row["loss_mask"],
            "rollout_log_probs": row["logprobs"] if meta.get("logprobs_complete", True) else None,
            "status": slime_status(row, meta),
            "metadata": {**meta, **{k: row[k] for k in ("trajectory_id", "task_id", "session_id", "group_id",
                                                         "strategy", "call_ids", "advantage", "weight")}},
        }


def verl_batch(table: pa.Table, pad_token_id: int = 0) -> dict[str, np.ndarray]:
    cols = table.select(["prompt_ids", "response_ids", "loss_mask", "logprobs", "reward", "advantage",
                         "weight", "group_id", "trajectory_id", "metadata"]).to_pydict()
    b = table.num_rows
    p = max((len(x) for x in cols["prompt_ids"]), default=0) or 1
    r = max((len(x) for x in cols["response_ids"]), default=0) or 1
    prompts = np.full((b, p), pad_token_id, dtype=np.int64)
    responses = np.full((b, r), pad_token_id, dtype=np.int64)
    attention = np.zeros((b, p + r), dtype=np.int64)
    response_mask = np.zeros((b, r), dtype=np.int64)
    old_log_probs = np.zeros((b, r), dtype=np.float32)
    scores = np.zeros((b, r), dtype=np.float32)
    for i in range(b):
        prompt, response = cols["prompt_ids"][i], cols["response_ids"][i]
        prompts[i, p - len(prompt):] = prompt
        responses[i, : len(response)] = response
        attention[i, p - len(prompt): p + len(response)] = 1
        response_mask[i, : len(response)] = cols["loss_mask"][i]
        old_log_probs[i, : len(response)] = cols["logprobs"][i]
        if response and cols["reward"][i] is not None:
            scores[i, len(response) - 1] = cols["reward"][i]
    complete = [json.loads(m).get("logprobs_complete", True) for m in cols["metadata"]]
    return {
        "prompts": prompts, "responses": responses, "input_ids": np.concatenate([prompts, responses], axis=1),
        "attention_mask": attention, "position_ids": np.clip(np.cumsum(attention, axis=1) - 1, 0, None),
        "response_mask": response_mask, "old_log_probs": old_log_probs, "token_level_scores": scores,
        "rewards": np.array([np.nan if x is None else x for x in cols["reward"]], dtype=np.float64),
        "advantages": np.array([np.nan if x is None else x for x in cols["advantage"]], dtype=np.float64),
        "weights": np.array(cols["weight"], dtype=np.float32).reshape(b),
        "logprobs_complete": np.array(complete, dtype=bool).reshape(b),
        "uid": np.array(cols["group_id"], dtype=str).reshape(b),
        "trajectory_id": np.array(cols["trajectory_id"], dtype=str).reshape(b),
    }


def sft_records(table: pa.Table) -> Iterator[dict[str, Any] | None]:
    """One record per row; None for rows that were built without their conversation."""
    for row in _rows(table):
        conversation = json.loads(row["metadata"]).get("conversation")
        if not conversation:
            yield None
            continue
        chat = conversation_messages(conversation["api"], conversation["request"], conversation["response"])
        yield {"trajectory_id": row["trajectory_id"], "task_id": row["task_id"], "session_id": row["session_id"],
               "api": conversation["api"], "messages": chat["messages"], "tools": chat["tools"],
               "reward": row["reward"], "status": row["status"]}


def write_export(table: pa.Table, fmt: str, out: str | os.PathLike, pad_token_id: int = 0) -> ExportResult:
    """Write one export; the file appears whole (temporary name, then rename)."""
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r}: expected one of {FORMATS}")
    out = Path(out)
    written = skipped = 0
    with atomic.replacing(out) as tmp:
        if fmt == "verl":
            with open(tmp, "wb") as f:
                np.savez_compressed(f, **verl_batch(table, pad_token_id))
            written = table.num_rows
        else:
            with open(tmp, "w", encoding="utf-8") as f:
                for item in (slime_samples(table) if fmt == "slime" else sft_records(table)):
                    if item is None:
                        skipped += 1
                        continue
                    f.write(json.dumps(item, ensure_ascii=False) + "\n")
                    written += 1
    return ExportResult(out, written, skipped)
