"""Which model family a chat template belongs to, and so how its replies write tool calls and reasoning (issue 45).

Read from the template's own text, never a silent default: the markers each family's template writes around a
tool call. Families the proxy parses map to a tool parser (polar_mitm/tokens/reply_parser.py); a template of a
family it does not parse yet is refused with one line naming the family and the way out (`--tool-parser` to
force one, when the user knows the model writes that form anyway). A template that renders no tool calls at all
gets no tool parser: replies are text (and `template_dropped_tools` flags each request that offered tools).

  markers                                        family            tool parser
  <tool_call> … <function=                       Qwen3-Coder       qwen3_coder
  <tool_call>                                    Qwen2.5/3, Hermes hermes
  [TOOL_CALLS]                                   Mistral           (not yet)
  <｜tool▁calls▁begin｜>                          DeepSeek V3/R1    (not yet)
  <|tool_calls_section_begin|>                   Kimi K2           (not yet)
  <arg_key>                                      GLM-4.5/4.6       (not yet)
  <|channel|>                                    gpt-oss harmony   (not yet)
  <|python_tag|>, <|start_header_id|>ipython     Llama 3.x         (not yet)
  <start_of_turn>                                Gemma 3           (not yet)
Reasoning: `think` when the template writes <think>, else none.
"""
from __future__ import annotations

from dataclasses import dataclass

PARSED = ("hermes", "qwen3_coder")
# (family, a marker its template writes, the parser; None: not parsed yet). First match wins: the more specific
# markers go first (Qwen3-Coder's <tool_call> holds <function=; GLM's holds <arg_key>).
FAMILIES: tuple[tuple[str, tuple[str, ...], str | None], ...] = (
    ("gpt-oss (harmony)", ("<|channel|>",), None),
    ("Mistral", ("[TOOL_CALLS]",), None),
    ("DeepSeek V3/R1", ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>"), None),
    ("Kimi K2", ("<|tool_calls_section_begin|>",), None),
    ("GLM-4.5", ("<arg_key>",), None),
    ("Qwen3-Coder", ("<function=",), "qwen3_coder"),
    ("Qwen/Hermes", ("<tool_call>",), "hermes"),
    ("Llama 3", ("<|python_tag|>", "ipython"), None),
    ("Gemma 3", ("<start_of_turn>",), None),
)


@dataclass(frozen=True)
class Formats:
    family: str
    tool_parser: str | None  # None: the template renders no tool calls; replies are text
    reasoning_parser: str | None  # "think" or None


def detect(template: str) -> Formats:
    """The family of a chat template and the parsers for its replies; ValueError (one line) for a family whose
    tool calls the proxy does not parse yet."""
    reasoning = "think" if "<think>" in template else None
    for family, markers, parser in FAMILIES:
        if any(m in template for m in markers):
            if parser is None:
                raise ValueError(f"the chat template is {family}'s, whose tool calls the proxy does not parse yet "
                                 f"(it parses {' and '.join(PARSED)}); pass --tool-parser "
                                 f"{'|'.join(PARSED)} if the model writes one of those")
            return Formats(family, parser, reasoning)
    return Formats("no tool calls in the template", None, reasoning)
