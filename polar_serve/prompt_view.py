"""What a scripted policy can see of a prompt: the decoded text read back into turns, the tools offered and the
tool results. Three layouts: ChatML (Qwen: tools in the system turn's <tools> block, results in <tool_response>
blocks or `tool` turns); Gemma 3's turns as Polar's template writes them with tools
(polar_mitm/tokens/templates/gemma3_tools.jinja: each tool's JSON on a line of the first user turn, results in
```tool_output blocks of user turns; its `model` role read as `assistant`); and Mistral's instruct format
([AVAILABLE_TOOLS]…[/AVAILABLE_TOOLS], [INST]…[/INST] user turns, an assistant turn up to </s>,
[TOOL_RESULTS]…[/TOOL_RESULTS] tool turns); and gpt-oss's harmony messages (<|start|>ROLE…<|message|>…<|end|>,
the developer message's instructions as the system turn and its `type NAME = (` lines as the tools offered, a
message from functions.NAME a tool turn; harmony's own fixed system message left out); and Llama 3's headed turns
(<|start_header_id|>ROLE<|end_header_id|>…<|eot_id|>, an ipython turn a tool result) as Polar's
llama3_tools.jinja writes them with tools: "Environment: ipython" before the system message, and a user turn of
the tools' JSON, read as the tools offered and left out of the turns); and DeepSeek V3's as Polar's
deepseek_v3_tools.jinja writes it (the system prompt up to its `## Tools` section, whose `### NAME` headings are
the tools offered; <｜User｜> and <｜Assistant｜> turns, each result of a <｜tool▁outputs▁begin｜> block a tool
turn)."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

TURN = re.compile(r"<\|im_start\|>([^\n]*)\n(.*?)(<\|im_end\|>|\Z)", re.DOTALL)
TOOLS_BLOCK = re.compile(r"<tools>\s*(.*?)\s*</tools>", re.DOTALL)
TOOL_RESPONSE = re.compile(r"<tool_response>\s*(.*?)\s*</tool_response>", re.DOTALL)
GEMMA_TURN = re.compile(r"<start_of_turn>([^\n]*)\n(.*?)(<end_of_turn>|\Z)", re.DOTALL)
TOOL_OUTPUT = re.compile(r"```tool_output\n(.*?)\n```", re.DOTALL)
HARMONY_MESSAGE = re.compile(r"<\|start\|>([^<]*)(?:<\|channel\|>[^<]*)?(?:<\|constrain\|>[^<]*)?<\|message\|>(.*?)"
                             r"(<\|end\|>|<\|call\|>|<\|return\|>|\Z)", re.DOTALL)
HARMONY_TOOL = re.compile(r"^type (\S+) = \(", re.MULTILINE)
LLAMA3_TURN = re.compile(r"<\|start_header_id\|>([^<]*)<\|end_header_id\|>\n\n(.*?)(<\|eot_id\|>|<\|eom_id\|>|\Z)",
                         re.DOTALL)
LLAMA3_TOOLS_INTRO = ("Answer the user's question by making use of the following functions if needed.\n"
                      "If none of the function can be used, please say so.\n"
                      "Here is a list of functions in JSON format:\n")  # polar_mitm/tokens/templates/llama3_tools.jinja
# DeepSeek V3 as Polar's deepseek_v3_tools.jinja writes it: after results the assistant writes on without a marker
DEEPSEEK_OPENS = {"<｜User｜>": "user", "<｜Assistant｜>": "assistant", "<｜tool▁outputs▁begin｜>": "tool",
                  "<｜tool▁outputs▁end｜>": "assistant"}
DEEPSEEK_MARK = re.compile("(" + "|".join(map(re.escape, [*DEEPSEEK_OPENS, "<｜end▁of▁sentence｜>"])) + ")")
DEEPSEEK_OUTPUT = re.compile(r"<｜tool▁output▁begin｜>(.*?)<｜tool▁output▁end｜>", re.DOTALL)
DEEPSEEK_TOOL = re.compile(r"^### (.+)\nDescription: ", re.MULTILINE)
MISTRAL_MARK = re.compile(r"(\[INST\]|\[/INST\]|\[TOOL_RESULTS\]|\[/TOOL_RESULTS\]|\[AVAILABLE_TOOLS\]|"
                          r"\[/AVAILABLE_TOOLS\]|</s>)")


@dataclass(frozen=True)
class Turn:
    role: str
    content: str
    tool_results: int  # <tool_response> (or ```tool_output) blocks in it (1 for a `tool` turn)
    only_results: bool = False  # nothing in it but those blocks

    @property
    def is_tool_result(self) -> bool:
        """A turn that carries only tool output (Qwen and Gemma put tool results in user turns)."""
        return self.role == "tool" or (self.tool_results > 0 and self.only_results)


@dataclass(frozen=True)
class PromptView:
    text: str
    turns: tuple[Turn, ...]  # closed turns only; the open generation turn is left out
    tools: tuple[str, ...]  # names offered, in order

    @property
    def last_user(self) -> str:
        for turn in reversed(self.turns):
            if turn.role == "user" and not turn.is_tool_result:
                return turn.content
        return ""

    @property
    def first_user(self) -> str:
        """The conversation's opening user message: a sub-agent's is the task its parent gave it."""
        return next((t.content for t in self.turns if t.role == "user" and not t.is_tool_result), "")

    @property
    def system(self) -> str:
        return next((t.content for t in self.turns if t.role == "system"), "")

    @property
    def tool_results(self) -> int:
        return sum(t.tool_results for t in self.turns)

    @property
    def after_tool_result(self) -> bool:
        return bool(self.turns) and self.turns[-1].is_tool_result

    @property
    def assistant_turns(self) -> int:
        return sum(t.role == "assistant" for t in self.turns)


def _names(block: str) -> tuple[str, ...]:
    try:
        parsed = json.loads(block)
        items = parsed if isinstance(parsed, list) else [parsed]
    except json.JSONDecodeError:  # one JSON object per line (Qwen2.5 style)
        items = []
        for line in block.splitlines():
            try:
                items.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return _names_of(items)


def _names_of(items: list) -> tuple[str, ...]:
    """The names of tool definitions (OpenAI's `{"function": {"name"}}` or a bare `{"name"}`)."""
    names: list[str] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        fn = item.get("function") if isinstance(item.get("function"), dict) else item
        if isinstance(fn.get("name"), str):
            names.append(fn["name"])
    return tuple(names)


def _tool_names(system: str) -> tuple[str, ...]:
    # the instructions mention "<tools></tools>" before the real block: take the first block that names tools
    for block in TOOLS_BLOCK.finditer(system):
        names = _names(block.group(1))
        if names:
            return names
    return ()


def _mistral(text: str) -> PromptView:
    turns: list[Turn] = []
    tools: tuple[str, ...] = ()
    pieces = MISTRAL_MARK.split(text)  # text, mark, text, mark, …
    opened, body = "", ""  # the mark whose section is being read, and its text so far
    for i, piece in enumerate(pieces):
        if i % 2 == 0:
            body += piece
            continue
        if piece == "[/INST]" and opened == "[INST]":
            turns.append(Turn("user", body, 0))
        elif piece == "[/TOOL_RESULTS]" and opened == "[TOOL_RESULTS]":
            turns.append(Turn("tool", body, 1))
        elif piece == "[/AVAILABLE_TOOLS]" and opened == "[AVAILABLE_TOOLS]":
            tools = tools or _names(body)
        elif piece == "</s>" and opened in ("[/INST]", "[/TOOL_RESULTS]"):
            turns.append(Turn("assistant", body, 0))  # (after a call's results, the answer: no [INST] between)
        opened, body = piece, ""
    return PromptView(text=text, turns=tuple(turns), tools=tools)


def _harmony(text: str) -> PromptView:
    turns: list[Turn] = []
    tools: tuple[str, ...] = ()
    for match in HARMONY_MESSAGE.finditer(text):
        header, body, end = match.groups()
        if not end:
            break  # the open message the model is asked to continue
        role = (header.split() or [""])[0]
        if role == "system":
            continue  # harmony's own, not the request's
        if role.startswith("functions."):
            turns.append(Turn("tool", body, 1, True))
            continue
        if role == "developer":
            role = "system"
            _, namespace, declarations = body.partition("namespace functions {")
            tools = tools or (tuple(HARMONY_TOOL.findall(declarations)) if namespace else ())
        turns.append(Turn(role, body, 0))
    return PromptView(text=text, turns=tuple(turns), tools=tools)


def _json_objects(text: str) -> list:
    """Whole JSON values written one after another (whitespace between), up to the first that does not parse."""
    decoder, values, at = json.JSONDecoder(), [], 0
    while (at := at + len(text[at:]) - len(text[at:].lstrip())) < len(text):  # at: the next value's first char
        try:
            value, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            break
        values.append(value)
    return values


def _llama3(text: str) -> PromptView:
    turns: list[Turn] = []
    tools: tuple[str, ...] = ()
    for match in LLAMA3_TURN.finditer(text):
        role, content, end = match.groups()
        if not end:
            break  # the open turn the model is asked to continue
        if role == "user" and content.startswith(LLAMA3_TOOLS_INTRO):  # the template's, not the request's
            listing = content[len(LLAMA3_TOOLS_INTRO):]
            tools = _names_of(_json_objects(listing))
            continue
        if role == "system":
            content = content.removeprefix("Environment: ipython").removeprefix("\n\n")
        if role == "ipython":
            turns.append(Turn("tool", content, 1, True))
            continue
        turns.append(Turn(role, content, 0))
    return PromptView(text=text, turns=tuple(turns), tools=tools)


def _deepseek_closed(role: str, content: str) -> list[Turn]:
    """The turns a user or tool-results piece of a DeepSeek prompt holds, once the next marker closes it."""
    if role == "user":
        return [Turn("user", content, 0)]
    if role == "tool":
        return [Turn("tool", result, 1, True) for result in DEEPSEEK_OUTPUT.findall(content)]
    return []


def _deepseek(text: str) -> PromptView:
    pieces = DEEPSEEK_MARK.split(text.removeprefix("<｜begin▁of▁sentence｜>"))
    system, _, section = pieces[0].partition("## Tools\n")
    turns = [Turn("system", system.removesuffix("\n\n"), 0)] if system else []
    role, content = "", ""
    for piece in pieces[1:]:
        if piece in DEEPSEEK_OPENS:
            turns += _deepseek_closed(role, content)
            role, content = DEEPSEEK_OPENS[piece], ""
        elif piece == "<｜end▁of▁sentence｜>":
            if role == "assistant":  # (an assistant turn without its end is the open one: left out)
                turns.append(Turn("assistant", content, 0))
            role, content = "", ""
        else:
            content += piece
    return PromptView(text=text, turns=tuple(turns), tools=tuple(DEEPSEEK_TOOL.findall(section)))


def parse_prompt(text: str) -> PromptView:
    if "[INST]" in text and "<|im_start|>" not in text:
        return _mistral(text)
    if text.startswith("<｜begin▁of▁sentence｜>"):
        return _deepseek(text)
    if text.startswith("<|begin_of_text|><|start_header_id|>"):
        return _llama3(text)
    if text.startswith("<|start|>"):  # (another family's prompt may hold harmony markup a model wrote as text)
        return _harmony(text)
    gemma = "<start_of_turn>" in text
    turn, results = (GEMMA_TURN, TOOL_OUTPUT) if gemma else (TURN, TOOL_RESPONSE)
    turns = []
    for match in turn.finditer(text):
        role, content, end = match.group(1).strip(), match.group(2), match.group(3)
        if not end:
            break  # the open turn the model is asked to continue
        role = "assistant" if gemma and role == "model" else role
        count = 1 if role == "tool" else len(results.findall(content))
        turns.append(Turn(role, content, count, not results.sub("", content).strip()))
    if gemma:  # the tools' schemas open the first user turn, one JSON object a line
        first = turns[0].content if turns else ""
        tools = _names("\n".join(line for line in first.splitlines() if line.startswith('{"name": ')))
    else:
        tools = _tool_names(next((t.content for t in turns if t.role == "system"), ""))
    return PromptView(text=text, turns=tuple(turns), tools=tools)
