"""Which model family a chat template belongs to, and so how its replies write tool calls and reasoning (issue 45).

Read from the template's own text, never a silent default: the markers each family's template writes around a
tool call, each family mapped to its tool parser (polar_mitm/tokens/reply_parser.py). A template that renders no
tool calls at all gets no tool parser: replies are text (and `template_dropped_tools` flags each request that
offered tools). Gemma 3 is the exception: its calling is prompt-based, so its template (which renders no tools)
is replaced by Polar's own, polar_mitm/tokens/templates/gemma3_tools.jinja: the same text without tools, the
tools and past calls in the prompt-based form with them. The proxy says so at start; `--tool-parser none` keeps
Gemma's own. DeepSeek V3's template renders no tool definitions either (and past calls and results only in some
shapes): it is replaced by polar_mitm/tokens/templates/deepseek_v3_tools.jinja, the same text wherever V3's is
right, with the tools in the system prompt. A gpt-oss tokenizer without a chat template (harmony's special
tokens, no template) gets Polar's harmony.jinja, the text openai-harmony renders; a Llama 3.1 vocabulary without
one (<|python_tag|>, <|eom_id|>) gets llama3_tools.jinja, the ids llama-models encodes. A Gemma template that
renders tools itself writes them some other way: it is refused with one line naming the ways out
(`--tool-parser` to force one, when the user knows the model writes that form anyway; `--render engine`,
polar_mitm/engines/chat.py, to let the engine render and parse).

  markers                                        family            tool parser
  <|channel|>                                    gpt-oss harmony   harmony (reasoning too: the analysis channel)
  [TOOL_CALLS]                                   Mistral           mistral
  <｜tool▁calls▁begin｜>                          DeepSeek V3/R1    deepseek_v3 (V3.1's shape too); V3: Polar's template
  <|tool_calls_section_begin|>                   Kimi K2           kimi_k2
  <arg_key>                                      GLM-4.5/4.6       glm45
  <tool_call> … <function=                       Qwen3-Coder       qwen3_coder
  <tool_call>                                    Qwen2.5/3, Hermes hermes
  <|python_tag|>, <|start_header_id|>ipython     Llama 3.x         llama3_json
  ```tool_code                                   Gemma 3, Polar's  tool_code
  <start_of_turn>                                Gemma 3           tool_code, with Polar's template (above)
Reasoning: `think` when the template writes <think>, `mistral` when it writes [THINK], else none.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from polar_mitm.tokens.reply_parser import TOOL_PARSERS as PARSED

TEMPLATES = Path(__file__).with_name("templates")
# (family, a marker its template writes, the parser). First match wins: the more specific markers go first
# (Qwen3-Coder's <tool_call> holds <function=; GLM's holds <arg_key>).
FAMILIES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("gpt-oss (harmony)", ("<|channel|>",), "harmony"),
    ("Mistral", ("[TOOL_CALLS]",), "mistral"),
    ("DeepSeek V3/R1", ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>"), "deepseek_v3"),
    ("Kimi K2", ("<|tool_calls_section_begin|>",), "kimi_k2"),
    ("GLM-4.5", ("<arg_key>",), "glm45"),
    ("Qwen3-Coder", ("<function=",), "qwen3_coder"),
    ("Qwen/Hermes", ("<tool_call>",), "hermes"),
    ("Llama 3", ("<|python_tag|>", "ipython"), "llama3_json"),
    ("Gemma 3 (tool_code)", ("```tool_code",), "tool_code"),  # Polar's Gemma 3 template, saved with a model
    ("Gemma 3", ("<start_of_turn>",), "tool_code"),
)
# Families whose own template renders no tools, and Polar's template that renders them the family's way. A
# template of such a family that does render tools is refused for Gemma (it writes them some unknown way) and kept
# for DeepSeek (V3.1's renders its tools and V3's call tokens); DeepSeek R1's (<think>) is kept too: Polar's is
# V3's, which writes no reasoning.
OWN_TEMPLATES = {"Gemma 3": TEMPLATES / "gemma3_tools.jinja",
                 "DeepSeek V3/R1": TEMPLATES / "deepseek_v3_tools.jinja"}
KEPT_WHEN_RENDERING_TOOLS = {"DeepSeek V3/R1"}
# Tokenizers published without a chat template, known by special tokens only their family has, and Polar's
# template for them: gpt-oss's harmony format (the npm o200k_harmony tokenizer ships none), checked against
# openai-harmony's own rendering; Llama 3.1's (a vocabulary converted from llama-models' tiktoken file has none),
# checked against llama-models' ChatFormat.
VOCABULARY_TEMPLATES = ((("<|channel|>", "<|constrain|>", "<|call|>"), TEMPLATES / "harmony.jinja"),
                        (("<|start_header_id|>", "<|python_tag|>", "<|eom_id|>"), TEMPLATES / "llama3_tools.jinja"))


def template_for_vocabulary(special_tokens: set[str]) -> Path | None:
    """Polar's template for a tokenizer that has none, when its special tokens name the family; else None."""
    for markers, template in VOCABULARY_TEMPLATES:
        if all(m in special_tokens for m in markers):
            return template
    return None


@dataclass(frozen=True)
class Formats:
    family: str
    tool_parser: str | None  # None: the template renders no tool calls; replies are text
    reasoning_parser: str | None  # "think", "mistral", "harmony" or None
    template: Path | None = None  # Polar's template, rendered instead of the model's (OWN_TEMPLATES)


def detect(template: str) -> Formats:
    """The family of a chat template and the parsers for its replies; ValueError (one line) for a template whose
    tool calls the proxy does not parse (a Gemma template rendering tools its own way)."""
    for family, markers, parser in FAMILIES:
        if any(m in template for m in markers):
            own = OWN_TEMPLATES.get(family)
            renders_tools = re.search(r"\btools\b", template) is not None
            if family in KEPT_WHEN_RENDERING_TOOLS and (renders_tools or reasoning_of(template)):
                own = None
            if own is not None and renders_tools:  # it renders tools itself, some other way
                raise ValueError(f"the chat template is {family}'s, whose tool calls the proxy does not parse yet "
                                 f"(it parses {', '.join(PARSED)}); pass --tool-parser NAME if the model writes "
                                 "one of those, or --render engine to let the engine render and parse")
            return Formats(family, parser, "harmony" if parser == "harmony" else reasoning_of(template), own)
    return Formats("no tool calls in the template", None, reasoning_of(template))


def reasoning_of(template: str) -> str | None:
    """The reasoning format a template writes: <think> (Qwen3, DeepSeek R1, GLM, Kimi) or [THINK] (Magistral)."""
    if "<think>" in template:
        return "think"
    return "mistral" if "[THINK]" in template else None
