"""Scripted policy: ordered rules over the decoded prompt; the first rule that matches gives the reply text, which
the server then teacher-forces through the model. Format: docs/reference-server.md."""
from __future__ import annotations

import dataclasses
import hashlib
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from polar_serve.prompt_view import PromptView
from polar_serve.reply_formats import write_reply

PLACEHOLDER = re.compile(r"\{(last_user|tool:[^{}\s]+)\}")
RULE_KEYS = {"name", "when", "reply", "think", "content", "tool_calls", "choose"}
REPLY_KEYS = {"reply", "think", "content", "tool_calls"}
CHOICE_KEYS = REPLY_KEYS | {"name", "weight"}
CALL_KEYS = {"name", "arguments", "arguments_for"}


class NoMatch(Exception):
    """A rule's reply names a tool that is not offered: the rule does not apply."""


@dataclass(frozen=True)
class Range:
    lo: int | None = None
    hi: int | None = None

    def __contains__(self, n: int) -> bool:
        return (self.lo is None or n >= self.lo) and (self.hi is None or n <= self.hi)


@dataclass(frozen=True)
class When:
    last_user_contains: tuple[str, ...] = ()
    last_user_regex: re.Pattern[str] | None = None
    first_user_contains: tuple[str, ...] = ()
    prompt_contains: tuple[str, ...] = ()
    prompt_regex: re.Pattern[str] | None = None
    tool_offered: tuple[str, ...] = ()
    any_tools: bool | None = None
    tool_results: Range | None = None
    after_tool_result: bool | None = None
    assistant_turns: Range | None = None
    negate: When | None = None

    def matches(self, view: PromptView) -> bool:
        checks = [
            not self.last_user_contains or any(s in view.last_user for s in self.last_user_contains),
            self.last_user_regex is None or bool(self.last_user_regex.search(view.last_user)),
            not self.first_user_contains or any(s in view.first_user for s in self.first_user_contains),
            not self.prompt_contains or any(s in view.text for s in self.prompt_contains),
            self.prompt_regex is None or bool(self.prompt_regex.search(view.text)),
            not self.tool_offered or any(t in view.tools for t in self.tool_offered),
            self.any_tools is None or self.any_tools == bool(view.tools),
            self.tool_results is None or view.tool_results in self.tool_results,
            self.after_tool_result is None or self.after_tool_result == view.after_tool_result,
            self.assistant_turns is None or view.assistant_turns in self.assistant_turns,
            self.negate is None or not self.negate.matches(view),
        ]
        return all(checks)


@dataclass(frozen=True)
class ToolCallSpec:
    names: tuple[str, ...]  # the first one the prompt offers is called
    arguments: Any = None  # dict (rendered as JSON) or str (raw JSON text)
    arguments_for: dict[str, Any] = field(default_factory=dict)  # per-tool override of `arguments`


@dataclass(frozen=True)
class Rule:
    name: str
    when: When
    reply: str | None = None
    think: str | None = None
    content: str = ""
    tool_calls: tuple[ToolCallSpec, ...] = ()
    choices: tuple[tuple[float, Rule], ...] = ()  # `choose:` (weight, reply) pairs, picked by a seeded draw

    def pick(self, view: PromptView, seed: int | None) -> Rule:
        """This rule, or for a `choose:` rule the reply a seeded draw picks: seeded from the request's `seed`
        when it has one, else from the conversation's first turns (the session: harnesses put the workspace
        path there), so a session keeps its choice from call to call and sessions of one task differ."""
        if not self.choices:
            return self
        key = f"{self.name}\0{seed}" if seed is not None else f"{self.name}\0{session_key(view)}"
        draw = random.Random(hashlib.sha256(key.encode()).digest()).random() * sum(w for w, _ in self.choices)
        for weight, choice in self.choices:
            draw -= weight
            if draw < 0:
                return choice
        return self.choices[-1][1]

    def render(self, view: PromptView, fmt: str = "hermes") -> Scripted:
        """The reply, and its text written as a model of format `fmt` writes one (polar_serve/reply_formats.py).
        Raises NoMatch."""
        if self.reply is not None:
            text = _fill(self.reply, view)
            return Scripted(self.name, text, None, text, ())
        calls = []
        for call in self.tool_calls:
            name = _pick(call.names, view)
            calls.append((name, _fill_args(call.arguments_for.get(name, call.arguments), view)))
        think, content = None if self.think is None else _fill(self.think, view), _fill(self.content, view)
        text = write_reply(fmt, think, content, calls, salt=f"{len(view.text)}:{view.tool_results}")
        return Scripted(self.name, text, think, content, tuple(calls))


@dataclass(frozen=True)
class Scripted:
    """A rule's reply: its text as the model writes it, and its parts (for the chat endpoint's parsed message)."""

    name: str
    text: str
    think: str | None
    content: str
    calls: tuple[tuple[str, Any], ...]  # (tool name, arguments: a dict, or JSON text written as it is)


@dataclass(frozen=True)
class Policy:
    rules: tuple[Rule, ...]

    def reply_for(self, view: PromptView, seed: int | None = None, fmt: str = "hermes") -> Scripted | None:
        """The reply (text in format `fmt`) of the first rule that matches, or None. A `choose:` rule's name gets
        the chosen reply's name appended (`rule/choice`)."""
        for rule in self.rules:
            if not rule.when.matches(view):
                continue
            chosen = rule.pick(view, seed)
            try:
                scripted = chosen.render(view, fmt)
            except NoMatch:
                continue
            return dataclasses.replace(scripted, name=rule.name if chosen is rule else f"{rule.name}/{chosen.name}")
        return None


def session_key(view: PromptView) -> str:
    """The conversation's opening (system turn and first user turn): stable for the whole session."""
    return "\0".join(f"{t.role}:{t.content}" for t in view.turns[:2])


def _pick(names: tuple[str, ...], view: PromptView) -> str:
    for name in names:
        if name in view.tools:
            return name
    raise NoMatch(names)


def _fill(text: str, view: PromptView) -> str:
    def sub(match: re.Match[str]) -> str:
        key = match.group(1)
        return view.last_user if key == "last_user" else _pick(tuple(key[5:].split("|")), view)

    return PLACEHOLDER.sub(sub, text)


def _fill_args(value: Any, view: PromptView) -> Any:
    if isinstance(value, str):
        return _fill(value, view)
    if isinstance(value, dict):
        return {k: _fill_args(v, view) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill_args(v, view) for v in value]
    return value


# -- parsing ----------------------------------------------------------------------------------------------------
def _strings(value: Any, key: str) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(s, str) and s for s in items):
        raise ValueError(f"{key}: expected a non-empty string or list of strings, got {value!r}")
    return tuple(items)


def _range(value: Any, key: str) -> Range:
    if isinstance(value, int) and not isinstance(value, bool):
        return Range(value, value)
    if isinstance(value, dict) and set(value) <= {"min", "max"} and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value.values()):
        return Range(value.get("min"), value.get("max"))
    raise ValueError(f"{key}: expected an integer or {{min: N, max: M}}, got {value!r}")


def _regex(value: Any, key: str) -> re.Pattern[str]:
    if not isinstance(value, str):
        raise ValueError(f"{key}: expected a regular expression string, got {value!r}")
    try:
        return re.compile(value, re.DOTALL)
    except re.error as e:
        raise ValueError(f"{key}: bad regular expression {value!r}: {e}") from e


def _bool(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{key}: expected true or false, got {value!r}")
    return value


def parse_when(data: Any, where: str) -> When:
    if data is None:
        return When()
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping of conditions, got {data!r}")
    unknown = set(data) - set(WHEN_PARSERS)
    if unknown:
        raise ValueError(f"{where}: unknown condition(s) {sorted(unknown)}; known: {sorted(WHEN_PARSERS)}")
    return When(**{("negate" if key == "not" else key): WHEN_PARSERS[key](value, f"{where}.{key}")
                   for key, value in data.items()})


WHEN_PARSERS = {
    "last_user_contains": _strings, "last_user_regex": _regex, "first_user_contains": _strings,
    "prompt_contains": _strings,
    "prompt_regex": _regex, "tool_offered": _strings, "any_tools": _bool, "tool_results": _range,
    "after_tool_result": _bool, "assistant_turns": _range, "not": parse_when,
}


def _parse_call(data: Any, where: str) -> ToolCallSpec:
    if not isinstance(data, dict) or "name" not in data or set(data) - CALL_KEYS:
        raise ValueError(f"{where}: expected {{name, arguments?, arguments_for?}}, got {data!r}")
    per_tool = data.get("arguments_for", {})
    if not isinstance(per_tool, dict):
        raise ValueError(f"{where}.arguments_for: expected a mapping tool name -> arguments")
    for key, args in [("arguments", data.get("arguments")), *per_tool.items()]:
        if args is not None and not isinstance(args, (dict, str)):
            raise ValueError(f"{where}: arguments for {key!r} must be a mapping or a JSON string, got {args!r}")
    return ToolCallSpec(_strings(data["name"], f"{where}.name"), data.get("arguments"), dict(per_tool))


def parse_rule(data: Any, index: int) -> Rule:
    where = f"rules[{index}]"
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping, got {data!r}")
    unknown = set(data) - RULE_KEYS
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {sorted(unknown)}; known: {sorted(RULE_KEYS)}")
    name = data.get("name", f"rule-{index}")
    if not isinstance(name, str):
        raise ValueError(f"{where}.name: expected a string, got {name!r}")
    when = parse_when(data.get("when"), f"{where}.when")
    if "choose" in data:
        if REPLY_KEYS & set(data):
            raise ValueError(f"{where}: give either `choose` or a reply (`reply`/`think`/`content`/`tool_calls`)")
        return Rule(name, when, choices=_parse_choices(data["choose"], f"{where}.choose"))
    return _parse_reply(data, name, when, where)


def _parse_choices(data: Any, where: str) -> tuple[tuple[float, Rule], ...]:
    if not isinstance(data, list) or not data:
        raise ValueError(f"{where}: expected a non-empty list of {{weight, reply…}}")
    choices = []
    for i, item in enumerate(data):
        at = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise ValueError(f"{at}: expected a mapping, got {item!r}")
        unknown = set(item) - CHOICE_KEYS
        if unknown:
            raise ValueError(f"{at}: unknown key(s) {sorted(unknown)}; known: {sorted(CHOICE_KEYS)}")
        weight = item.get("weight")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0 or weight == float("inf"):
            raise ValueError(f"{at}.weight: expected a positive number, got {weight!r}")
        name = item.get("name", f"choice-{i}")
        if not isinstance(name, str):
            raise ValueError(f"{at}.name: expected a string, got {name!r}")
        choices.append((float(weight), _parse_reply(item, name, When(), at)))
    return tuple(choices)


def _parse_reply(data: dict[str, Any], name: str, when: When, where: str) -> Rule:
    structured = {"think", "content", "tool_calls"} & set(data)
    if ("reply" in data) == bool(structured):
        raise ValueError(f"{where}: give either `reply` or some of `think`/`content`/`tool_calls`")
    for key in ("reply", "think", "content"):
        if key in data and not isinstance(data[key], str):
            raise ValueError(f"{where}.{key}: expected a string, got {data[key]!r}")
    calls = data.get("tool_calls", [])
    if not isinstance(calls, list):
        raise ValueError(f"{where}.tool_calls: expected a list")
    return Rule(
        name=name,
        when=when,
        reply=data.get("reply"),
        think=data.get("think"),
        content=data.get("content", ""),
        tool_calls=tuple(_parse_call(c, f"{where}.tool_calls[{i}]") for i, c in enumerate(calls)),
    )


def parse_policy(data: Any) -> Policy:
    if not isinstance(data, dict) or not isinstance(data.get("rules"), list) or set(data) - {"rules"}:
        raise ValueError("a policy is a mapping with one key, `rules`: a list of rules")
    return Policy(tuple(parse_rule(r, i) for i, r in enumerate(data["rules"])))


def load_policy(path: str | Path) -> Policy:
    with open(path, encoding="utf-8") as f:
        try:
            data = yaml.safe_load(f)
        except yaml.YAMLError as e:  # one line: FILE:LINE: problem
            mark = getattr(e, "problem_mark", None)
            raise ValueError(f"{path}:{mark.line + 1 if mark else 1}: not valid YAML: "
                             f"{getattr(e, 'problem', None) or e}") from e
    try:
        return parse_policy(data)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e
