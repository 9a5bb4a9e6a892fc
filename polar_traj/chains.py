"""prefix_merge: group one session's calls into chains of exact token extensions, and say why a chain
started where it did.

Rules (docs/trajectories.md tells the same story):
- Parent: call B's parent is the earlier call A with the longest `A.prompt_ids + A.output_ids` that is a
  literal prefix of `B.prompt_ids` (ties: the later A). Calls and parents form a tree per conversation.
- Chains: a chain follows one path of that tree. When a call has several children (a retry, a side call
  that extends the full history, a harness that re-rendered only the latest turns), the child with the
  largest subtree continues the chain (ties: the earliest); each other child starts its own chain,
  labelled `fork`, or a break (reasons below) when it and the continuing child share tokens past the
  parent: one of them re-included the other's turn, re-rendered (inside sampled tokens) or edited.
- A call without a parent starts a chain. Its label says why, from where its prompt leaves the most
  similar earlier history (k = longest common prefix with any earlier call's prompt + output):
  * k lies inside tokens an earlier call sampled: the harness re-rendered history (`template` when a
    block of the sampled turn was rewritten or dropped, e.g. reasoning stripped; `retokenized` when the
    same turn came back as slightly different token ids that re-align within a few tokens);
  * k lies in harness/template tokens, the prompt keeps at least half of that conversation's first
    prompt, and the old conversation never continues afterwards: `compaction` when the prompt is shorter
    than the last context of the old conversation, else `content` (earlier messages were edited);
  * otherwise `new` (first call, sub-agent, title or other side call).
  A root whose whole prompt is earlier history (a retry of the first call) is a `fork` too.
  The proxy's own reason (`prefix_source = "rendered:<why>"`) names the break when it names one of the
  four reasons. A break always starts a new chain: the trained context of every sampled token stays
  exactly the prompt the engine saw (re-rendered history rule: "new chain, labelled").
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .records import CallRecord

REASONS = ("template", "content", "compaction", "retokenized")
START_KINDS = ("new", "fork", "break")
REALIGN_WINDOW = 8  # tokens searched on each side for a retokenized turn to re-align
REALIGN_SLACK = 4  # at most this many more/fewer tokens in the re-encoded span
REALIGN_RUN = 4  # equal tokens that count as re-aligned


@dataclass(frozen=True)
class ChainStart:
    kind: str  # "new" | "fork" | "break"
    reason: str | None = None  # for breaks, one of REASONS
    related_call_id: str | None = None  # fork: the parent; break: the call whose history was left
    diverged_at: int | None = None  # token index where the prompt leaves the related history

    def to_dict(self) -> dict:
        return {"kind": self.kind, "reason": self.reason, "related_call_id": self.related_call_id,
                "diverged_at": self.diverged_at}


@dataclass(frozen=True)
class Chain:
    calls: tuple[CallRecord, ...]
    start: ChainStart


def order_calls(records: Sequence[CallRecord]) -> list[CallRecord]:
    """Calls in the order they were made (file order breaks ties: records are appended on completion)."""
    return [r for _, r in sorted(enumerate(records), key=lambda pair: (pair[1].started_at, pair[0]))]


def full_len(record: CallRecord) -> int:
    return len(record.prompt_ids) + len(record.output_ids)


def extends(prompt: tuple[int, ...], parent: CallRecord) -> bool:
    """Whether `prompt` starts with exactly parent.prompt_ids + parent.output_ids."""
    head, out = parent.prompt_ids, parent.output_ids
    n = len(head) + len(out)
    if n == 0 or n > len(prompt):
        return False
    if prompt[n - 1] != (out[-1] if out else head[-1]) or (head and prompt[len(head) - 1] != head[-1]):
        return False  # cheap rejection before comparing everything
    # the sampled part first: it is short, and where re-rendered history differs
    return prompt[len(head): n] == out and prompt[: len(head)] == head


def find_parents(calls: Sequence[CallRecord]) -> list[int | None]:
    """Index of each call's parent (longest literal extension wins; ties go to the later call)."""
    parents: list[int | None] = []
    ranked: list[tuple[int, int]] = []  # (-full_len, -index) of earlier calls, longest first
    for i, call in enumerate(calls):
        parent = None
        start = bisect.bisect_left(ranked, (-len(call.prompt_ids), -len(calls)))
        for _, neg_j in ranked[start:]:
            if extends(call.prompt_ids, calls[-neg_j]):
                parent = -neg_j
                break
        parents.append(parent)
        bisect.insort(ranked, (-full_len(call), -i))
    return parents


def main_children(parents: Sequence[int | None]) -> dict[int, int]:
    """For each parent, the child that continues its chain: largest subtree, then earliest."""
    size = [1] * len(parents)
    for i in range(len(parents) - 1, -1, -1):
        if parents[i] is not None:
            size[parents[i]] += size[i]
    chosen: dict[int, int] = {}
    for i, p in enumerate(parents):
        if p is not None and (p not in chosen or size[i] > size[chosen[p]]):
            chosen[p] = i
    return chosen


def prefix_merge(calls: Sequence[CallRecord]) -> list[Chain]:
    """Chains of one session. `calls`: its usable calls (no error records), in call order."""
    parents = find_parents(calls)
    main = main_children(parents)
    classifier = _StartClassifier(calls, parents)
    members: list[list[int]] = []
    starts: list[ChainStart] = []
    chain_of: dict[int, int] = {}
    for i, p in enumerate(parents):
        if p is not None and main[p] == i:
            chain_of[i] = chain_of[p]
            members[chain_of[i]].append(i)
            continue
        chain_of[i] = len(members)
        members.append([i])
        if p is not None:
            starts.append(classifier.classify_fork(i, p, main[p]))
        else:
            starts.append(classifier.classify(i))
    return [Chain(tuple(calls[i] for i in idx), start) for idx, start in zip(members, starts)]


class _StartClassifier:
    """Labels the first call of each chain: roots (no parent) and non-continuing children (forks)."""

    def __init__(self, calls: Sequence[CallRecord], parents: Sequence[int | None]) -> None:
        self.calls = calls
        self.tree: list[int] = []
        self.members: dict[int, list[int]] = {}
        for i, p in enumerate(parents):
            self.tree.append(i if p is None else self.tree[p])
            self.members.setdefault(self.tree[i], []).append(i)
        self.ranked = sorted(range(len(calls)), key=lambda j: (-full_len(calls[j]), -j))  # longest first
        self._full: dict[int, np.ndarray] = {}

    def full(self, j: int) -> np.ndarray:
        if j not in self._full:
            c = self.calls[j]
            self._full[j] = np.asarray(c.prompt_ids + c.output_ids, dtype=np.int32)
        return self._full[j]

    def classify_fork(self, i: int, parent: int, winner: int) -> ChainStart:
        """Call i extends `parent`, whose chain goes on with `winner` instead. A plain fork unless one of the
        two also re-includes the other's turn beyond the parent: then the harness re-rendered or edited it."""
        early, late = sorted((i, winner))
        k = _common_prefix(np.asarray(self.calls[late].prompt_ids, dtype=np.int32), self.full(early))
        if k <= full_len(self.calls[parent]):
            return ChainStart("fork", None, self.calls[parent].call_id, full_len(self.calls[parent]))
        e = self.calls[early]
        if len(e.prompt_ids) <= k < full_len(e):
            guess = rerender_reason(e.output_ids[k - len(e.prompt_ids):], self.calls[late].prompt_ids[k:])
        else:
            guess = "content"
        other = self.calls[winner if i == early else early]
        return ChainStart("break", _hint(self.calls[late]) or guess, other.call_id, k)

    def shared_history(self, i: int) -> tuple[int, list[int]]:
        """k = the longest common prefix of call i's prompt with any earlier call's prompt + output, and the
        earlier calls that reach it. Longest histories first: a call no longer than k cannot beat it (and,
        having no parent, call i cannot extend one of exactly k tokens), so the scan stops there."""
        prompt = np.asarray(self.calls[i].prompt_ids, dtype=np.int32)
        k, best = 0, []
        for j in self.ranked:
            if j >= i:
                continue
            if k and full_len(self.calls[j]) <= k:
                break
            shared = _common_prefix(prompt, self.full(j))
            if shared > k:
                k, best = shared, [j]
            elif shared == k and k:
                best.append(j)
        return k, sorted(best)

    def classify(self, i: int) -> ChainStart:
        call = self.calls[i]
        k, best = self.shared_history(i)
        if k == 0:
            return ChainStart("new")
        if k == len(call.prompt_ids):  # the whole prompt is earlier history: another sample of a known context
            return ChainStart("fork", None, self.calls[best[-1]].call_id, k)
        inside_output = [j for j in best if len(self.calls[j].prompt_ids) <= k < full_len(self.calls[j])]
        if inside_output:
            j = inside_output[-1]
            guess = rerender_reason(self.calls[j].output_ids[k - len(self.calls[j].prompt_ids):],
                                    call.prompt_ids[k:])
            return ChainStart("break", _hint(call) or guess, self.calls[j].call_id, k)
        j = best[-1]
        first_prompt = self.calls[self.tree[j]].prompt_ids
        same_tree = self.members[self.tree[j]]
        if 2 * k < len(first_prompt) or same_tree[-1] > i:
            return ChainStart("new", None, self.calls[j].call_id, k)
        tip = max(m for m in same_tree if m < i)
        guess = "compaction" if len(call.prompt_ids) < full_len(self.calls[tip]) else "content"
        return ChainStart("break", _hint(call) or guess, self.calls[j].call_id, k)


def rerender_reason(old_tail: Sequence[int], new_tail: Sequence[int]) -> str:
    """`retokenized` when the sampled turn's remaining tokens re-align with the new prompt after a short,
    similar-length difference (the same text, encoded differently); else `template`."""
    old_tail, new_tail = tuple(old_tail), tuple(new_tail)
    for a in range(min(REALIGN_WINDOW, len(old_tail)) + 1):
        run = min(REALIGN_RUN, len(old_tail) - a)
        for b in range(max(0, a - REALIGN_SLACK), min(a + REALIGN_SLACK, REALIGN_WINDOW, len(new_tail)) + 1):
            if run == 0 or old_tail[a: a + run] == new_tail[b: b + run]:
                return "retokenized"
    return "template"


def _hint(call: CallRecord) -> str | None:
    """The break reason the proxy gave, when its `rendered:<why>` names one of ours."""
    if not call.prefix_source.startswith("rendered:"):
        return None
    why = call.prefix_source.split(":", 1)[1].lower()
    for reason, words in (("retokenized", ("retoken",)), ("template", ("template",)),
                          ("compaction", ("compact",)), ("content", ("content",))):
        if any(w in why for w in words):
            return reason
    return None


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix; compares a small window first so unrelated sequences cost little."""
    m, start, step = min(len(a), len(b)), 0, 64
    while start < m:
        end = min(m, start + step)
        diff = np.flatnonzero(a[start:end] != b[start:end])
        if diff.size:
            return start + int(diff[0])
        start, step = end, step * 8
    return m
