"""A trajectory's response tokens as the trainer sees them: sampled runs (loss_mask 1, with logprobs) and
the context between calls (loss_mask 0: tool results, chat template). Shared by `make demo`'s terminal
print-out and the token view of `polar report`."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

Decode = Callable[[Sequence[int]], str]
ELLIPSIS_AT = 90  # context runs longer than this many characters are shortened in the terminal


@dataclass(frozen=True)
class MaskRun:
    """Tokens [start, end) of a response that share one loss-mask value."""

    start: int
    end: int
    sampled: bool  # loss_mask 1

    @property
    def size(self) -> int:
        return self.end - self.start


def mask_runs(mask: Sequence[int]) -> list[MaskRun]:
    runs: list[MaskRun] = []
    start = 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or bool(mask[i]) != bool(mask[start]):
            runs.append(MaskRun(start, i, bool(mask[start])))
            start = i
    return runs


def load_decode(model_dir: str | os.PathLike) -> Decode:
    """`decode(ids) -> text` from the model directory's tokenizer (no special-token stripping)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    tok = AutoTokenizer.from_pretrained(Path(model_dir))
    return lambda ids: tok.decode(list(ids))


def piece_table(ids: Sequence[int], decode: Decode) -> dict[int, str]:
    """The text of each distinct token id, decoded alone."""
    return {i: decode([i]) for i in sorted(set(ids))}


def _short(text: str) -> str:
    return text if len(text) <= ELLIPSIS_AT else text[:40] + " … " + text[-40:]


def terminal_lines(row: dict[str, Any], decode: Decode, shown: int) -> list[str]:
    """One trajectory row (prompt/response ids, loss_mask, logprobs) as terminal lines: each sampled token
    with its logprob, each stretch of context between calls as one decoded line."""
    mask, ids, lps = row["loss_mask"], row["response_ids"], row["logprobs"]
    sampled = sum(mask)
    lines = [f"trajectory {row['trajectory_id']}: {row['num_calls']} calls, strategy {row['strategy']}, "
             f"status {row['status']}, prompt {row['prompt_len']} tokens, response {row['response_len']} tokens "
             f"({sampled} sampled = loss_mask 1, {len(mask) - sampled} between calls = loss_mask 0)",
             f"  {'#':>4} {'mask':>4} {'id':>5} {'logprob':>9}  token"]
    for run in mask_runs(mask[:shown]):
        if run.sampled:
            lines += [f"  {i:4d} {1:4d} {ids[i]:5d} {lps[i]:9.4f}  {decode([ids[i]])!r}"
                      for i in range(run.start, run.end)]
        else:
            end = run.end if run.end < shown else _context_end(mask, run.start)
            text = _short(decode(ids[run.start:end]))
            lines.append(f"  {run.start:4d} {0:4d}  ({end - run.start} tokens the engine read between calls: "
                         f"tool result, template) {text!r}")
    if len(ids) > shown:
        lines.append(f"  … {len(ids) - shown} more")
    return lines


def _context_end(mask: Sequence[int], start: int) -> int:
    end = start
    while end < len(mask) and not mask[end]:
        end += 1
    return end
