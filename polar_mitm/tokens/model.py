"""The served model as the proxy needs it: tokenizer, chat template, stop tokens, context length."""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polar_mitm.conversation import Conversation, Message, Tool, ToolCall
from polar_mitm.tokens.detok import Detokenizer
from polar_mitm.tokens.family import Formats, detect, reasoning_of, template_for_vocabulary
from polar_mitm.tokens.prompt import ChatRenderer
from polar_mitm.tokens import gguf, reply_parser
from polar_mitm.tokens.reply_parser import ReplyParser, new_parser

# auto: read from the chat template (polar_mitm/tokens/family.py)
TOOL_PARSERS = ("auto", *reply_parser.TOOL_PARSERS, "none")
REASONING_PARSERS = ("auto", *reply_parser.REASONING_PARSERS, "none")
_PROBE = (Message("user", "hi"),)


@dataclass(frozen=True)
class Model:
    tokenizer: Any
    renderer: ChatRenderer
    stop_ids: frozenset[int]  # end-of-turn ids: sampled last, never shown as text
    context_length: int
    served_names: tuple[str, ...]
    tool_parser: str | None  # None: the template renders no tool calls, replies are text
    reasoning_parser: str | None
    starts_in_reasoning: bool  # the generation prompt already opens <think> (Qwen3-style thinking templates)
    template_drops: frozenset[str] = frozenset()  # of "tools", "tool_calls", "tool_results": what it never renders
    max_token_bytes: int = 0  # the longest vocabulary entry, in UTF-8 bytes (0: unknown)
    family: str = ""  # what the chat template was read as (polar_mitm/tokens/family.py), or "given"

    def dropped_by_template(self, conv: Conversation) -> list[str]:
        """Flags for what this conversation holds that the chat template silently leaves out."""
        if not self.template_drops:
            return []
        present = {"tools": bool(conv.tools),
                   "tool_calls": any(m.tool_calls for m in conv.messages),
                   "tool_results": any(m.role == "tool" for m in conv.messages)}
        return [f"template_dropped_{k}" for k in ("tools", "tool_calls", "tool_results")
                if present[k] and k in self.template_drops]

    def new_decoder(self, call_id: str) -> tuple[Detokenizer, ReplyParser]:
        parser = new_parser(self.tool_parser, self.reasoning_parser, starts_in_reasoning=self.starts_in_reasoning,
                            call_id_prefix=call_id.replace("call-", "call_") + "_")
        return Detokenizer(self.tokenizer), parser


def without_torch() -> None:
    """For a process that only tokenizes (the proxy): transformers imports torch whenever it is installed, half of
    a proxy's start-up CPU (~1 s) for nothing it uses. A None entry in sys.modules makes torch absent (find_spec
    says so, an import raises ImportError). Not in a process that already imported it, nor in one that may need it
    later (the test runner): call it first thing in the proxy's own process."""
    if "torch" not in sys.modules:
        sys.modules["torch"] = None  # type: ignore[assignment]
        os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")  # its "PyTorch was not found" line


def load_model(spec: str, tool_parser: str = "auto", reasoning_parser: str = "auto", context_length: int = 0) -> Model:
    """Load from a local directory (or a .gguf file inside one); raises ValueError with the reason. `auto`: the
    parsers the chat template's family calls for (polar_mitm/tokens/family.py), a family not parsed yet refused."""
    if tool_parser not in TOOL_PARSERS:
        raise ValueError(f"tool parser must be one of {TOOL_PARSERS}, got {tool_parser!r}")
    if reasoning_parser not in REASONING_PARSERS:
        raise ValueError(f"reasoning parser must be one of {REASONING_PARSERS}, got {reasoning_parser!r}")
    path = Path(spec).expanduser()
    if not path.exists():
        raise ValueError(f"{path} does not exist")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach a hub from the proxy
    from transformers import AutoTokenizer

    model_dir = gguf.tokenizer_dir(path) if path.suffix == ".gguf" else path  # ValueError: cannot convert
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot load a tokenizer from {path}: {e}") from e
    own_whole = None
    if not getattr(tokenizer, "chat_template", None):
        own_whole = template_for_vocabulary(set(tokenizer.get_added_vocab()))
        if own_whole is None:
            raise ValueError(f"{path} has no chat template")
        tokenizer.chat_template = own_whole.read_text()  # gpt-oss: Polar's harmony.jinja
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else json.dumps(
        tokenizer.chat_template)  # a list of named templates in some tokenizer configs
    formats = detect(template) if tool_parser == "auto" else None  # ValueError: a family not parsed yet
    if formats is not None and formats.template is not None:  # Gemma 3: Polar's template renders its tools
        template = tokenizer.chat_template = formats.template.read_text()
    tools = formats.tool_parser if formats else (None if tool_parser == "none" else tool_parser)
    if reasoning_parser == "auto":
        reasoning_parser = (formats.reasoning_parser if formats else
                            "harmony" if tools == "harmony" else reasoning_of(template)) or "none"
    new_parser(tools, reasoning_parser)  # ValueError here, at start, for a pair no parser takes (harmony's)
    config = _read_json(model_dir / "config.json")
    stop = set(_as_list(_read_json(model_dir / "generation_config.json").get("eos_token_id")))
    if tokenizer.eos_token_id is not None:
        stop.add(tokenizer.eos_token_id)
    harmony_template = formats is not None and formats.tool_parser == "harmony"  # not a --tool-parser harmony
    renderer = ChatRenderer(tokenizer, turn_end="<|end|>" if harmony_template else None)
    reasoning = None if reasoning_parser == "none" else reasoning_parser
    opening = reply_parser.REASONING_TAGS.get(reasoning or "", ("",))[0]  # harmony opens no tag
    opened = bool(opening) and renderer.render_text(_PROBE, (), generation_prompt=True).rstrip().endswith(opening)
    return Model(
        tokenizer=tokenizer,
        renderer=renderer,
        stop_ids=frozenset(stop),
        context_length=context_length or int(config.get("max_position_embeddings") or 32768),
        served_names=(gguf.model_name(path),),
        tool_parser=tools,
        reasoning_parser=reasoning,
        starts_in_reasoning=bool(reasoning) and opened,
        template_drops=template_drops(renderer),
        max_token_bytes=longest_token(tokenizer),
        family=_family_line(formats, own_whole, tool_parser),
    )


def _family_line(formats: Formats | None, own_whole: Path | None, tool_parser: str) -> str:
    """What the proxy says at start about the model: its family, and the template of Polar's it renders with."""
    if formats is None:
        return f"given: --tool-parser {tool_parser}"
    if formats.template is not None:
        return f"{formats.family}; tools rendered by Polar's {formats.template.name}"
    if own_whole is not None:
        return f"{formats.family}; no chat template in the tokenizer, Polar's {own_whole.name} renders"
    return formats.family


def longest_token(tokenizer: Any) -> int:
    """An upper bound of the characters one token stands for: its vocabulary entry's UTF-8 length (a byte-level
    entry spends at most two bytes per byte it stands for, a sentencepiece one three for its space mark)."""
    try:
        return max((len(t.encode("utf-8", "surrogatepass")) for t in tokenizer.get_vocab()), default=0)
    except Exception:  # a tokenizer without a vocabulary listing: no early length check
        return 0


def template_drops(renderer: ChatRenderer) -> frozenset[str]:
    """Which tool parts the chat template never renders, probed once with marker names (a template that only
    renders `role` and string `content`, like SmolLM2's, drops all three)."""
    tool = Tool("polar_probe_tool", "polar probe", {"type": "object", "properties": {}})
    call = ToolCall("polarprob", "polar_probe_call", "{}")  # 9 letters: Mistral's templates refuse other ids
    probes = {
        "tools": ((Message("user", "hi"),), (tool,), "polar_probe_tool"),
        "tool_calls": ((Message("user", "hi"), Message("assistant", "", tool_calls=(call,))), (tool,), "polar_probe_call"),
        "tool_results": ((Message("user", "hi"), Message("assistant", "", tool_calls=(call,)),
                          Message("tool", "polar_probe_result", tool_call_id="polarprob", name="polar_probe_call")),
                         (tool,), "polar_probe_result"),
    }
    dropped = set()
    for name, (messages, tools, marker) in probes.items():
        try:
            text = renderer.render_text(messages, tools, generation_prompt=True)
        except Exception:  # a template that refuses the probe's shape: it cannot render that part either
            text = ""
        if marker not in text:
            dropped.add(name)
    return frozenset(dropped)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _as_list(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]
