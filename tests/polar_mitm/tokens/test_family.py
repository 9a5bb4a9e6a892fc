"""The model family read from its chat template (issue 45 item 2, polar_mitm/tokens/family.py): the proxy's tool
and reasoning parsers come from the template, never a silent default; Gemma 3, whose template renders no tools,
gets Polar's template for them; a template whose tool calls it does not parse (a Gemma template that renders tools
some other way) is refused in one line naming it and the ways out, and `--tool-parser` still forces one."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from polar_mitm.launch import free_port
from polar_mitm.tokens.family import FAMILIES, PARSED, detect
from polar_mitm.tokens.model import load_model

ROOT = Path(__file__).resolve().parents[3]
TINY = ROOT / "fixtures" / "tiny-qwen2"

# The tool-call part of each family's template, as its published chat template writes it (abridged).
TEMPLATES = {
    "Mistral": "{%- if message.tool_calls %}[TOOL_CALLS][{{ message.tool_calls | tojson }}]</s>{%- endif %}",
    "DeepSeek V3/R1": "{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type']}}",
    "Kimi K2": "<|tool_calls_section_begin|>{%- for tc in message.tool_calls -%}<|tool_call_begin|>",
    "GLM-4.5": "<tool_call>{{ tc.name }}{% for k, v in tc.arguments.items() %}<arg_key>{{ k }}</arg_key>",
    "gpt-oss (harmony)": "<|start|>assistant<|channel|>commentary to=functions.{{ tool_call.name }}",
    "Llama 3": "<|start_header_id|>ipython<|end_header_id|>{{- '<|python_tag|>' + tool_call.name }}",
    "Gemma 3": "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}",
}


def test_the_qwen_template_reads_as_hermes_with_think():
    formats = detect((TINY / "chat_template.jinja").read_text())
    assert (formats.family, formats.tool_parser, formats.reasoning_parser) == ("Qwen/Hermes", "hermes", "think")
    model = load_model(str(TINY))  # auto, as the proxy starts by default
    assert (model.tool_parser, model.reasoning_parser, model.family) == ("hermes", "think", "Qwen/Hermes")


def test_qwen3_coder_and_a_template_without_tools():
    coder = detect("<tool_call>\n<function={{ tool_call.name }}>\n<parameter={{ k }}>")
    assert (coder.family, coder.tool_parser, coder.reasoning_parser) == ("Qwen3-Coder", "qwen3_coder", None)
    plain = detect("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{% endfor %}")
    assert (plain.tool_parser, plain.reasoning_parser) == (None, None)  # replies are text, never parsed as hermes


PARSERS = {"Mistral": ("mistral", None), "DeepSeek V3/R1": ("deepseek_v3", None), "Kimi K2": ("kimi_k2", None),
           "GLM-4.5": ("glm45", None), "gpt-oss (harmony)": ("harmony", "harmony"), "Llama 3": ("llama3_json", None),
           "Gemma 3": ("tool_code", None)}


@pytest.mark.parametrize("family", PARSERS)
def test_each_family_gets_its_own_parsers(family):
    formats = detect(TEMPLATES[family])
    assert (formats.family, formats.tool_parser, formats.reasoning_parser) == (family, *PARSERS[family])
    harmony = family.startswith("gpt-oss")  # reasons in its analysis channel, whatever else the template says
    thinking = detect(TEMPLATES[family] + "{{ '<think>' + reasoning_content + '</think>' }}")
    assert thinking.reasoning_parser == ("harmony" if harmony else "think")
    assert detect(TEMPLATES[family] + "[THINK]").reasoning_parser == ("harmony" if harmony else "mistral")


# A Gemma template that renders tools its own way (FunctionGemma's markup, abridged): not Gemma 3's prompt form.
GEMMA_WITH_TOOLS = ("{{ bos_token }}{% for t in tools or [] %}<start_function_declaration>{{ t | tojson }}"
                    "<end_function_declaration>{% endfor %}{% for m in messages %}<start_of_turn>"
                    "{{ 'model' if m.role == 'assistant' else m.role }}\n{{ m.content | trim }}<end_of_turn>\n"
                    "{% endfor %}")


def test_a_template_whose_calls_are_not_parsed_is_refused_in_one_line():
    assert all(parser for _f, _m, parser in FAMILIES)  # every family listed is parsed
    with pytest.raises(ValueError) as e:
        detect(GEMMA_WITH_TOOLS)
    assert str(e.value) == (f"the chat template is Gemma 3's, whose tool calls the proxy does not parse yet (it "
                            f"parses {', '.join(PARSED)}); pass --tool-parser NAME if the model writes one of those, "
                            "or --render engine to let the engine render and parse")


def model_with_template(tmp_path: Path, name: str, template: str) -> Path:
    """tiny-qwen2's tokenizer with another family's chat template."""
    model = tmp_path / name
    shutil.copytree(TINY, model)
    (model / "chat_template.jinja").unlink()
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    return model


def test_a_mistral_template_loads_with_mistrals_parsers(tmp_path):
    model = model_with_template(tmp_path, "mistral-like", (
        "{% for m in messages %}[INST] {{ m.content }} [/INST]{% if m.tool_calls %}[TOOL_CALLS]"
        "{{ m.tool_calls | tojson }}{% endif %}{% endfor %}{% if reasoning %}[THINK]{% endif %}"))
    loaded = load_model(str(model))
    assert (loaded.tool_parser, loaded.reasoning_parser, loaded.family) == ("mistral", "mistral", "Mistral")
    _detok, parser = loaded.new_decoder("call-1")
    parser.feed('[THINK]hm[/THINK]ok[TOOL_CALLS]bash[ARGS]{"command": "ls"}')
    parser.finish()
    assert (parser.reasoning, parser.content, [c.name for c in parser.tool_calls]) == ("hm", "ok", ["bash"])


def test_the_proxy_refuses_an_unknown_family_and_takes_a_forced_parser(tmp_path):
    model = model_with_template(tmp_path, "gemma-like", GEMMA_WITH_TOOLS)
    with pytest.raises(ValueError, match=r"^the chat template is Gemma 3's"):
        load_model(str(model))
    forced = load_model(str(model), tool_parser="hermes")
    assert (forced.tool_parser, forced.reasoning_parser, forced.family) == ("hermes", None,
                                                                            "given: --tool-parser hermes")
    with pytest.raises(ValueError, match="harmony is both"):
        load_model(str(model), tool_parser="hermes", reasoning_parser="harmony")
    done = subprocess.run([sys.executable, "-m", "polar.cli", "proxy", "--tokenizer", str(model), "--backend",
                           "http://127.0.0.1:9", "--proxy-port", str(free_port()), "--base-url-port", str(free_port()),
                           "--confdir", str(tmp_path / "mitm")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "polar_tokenizer: the chat template is Gemma 3's" in done.stderr and "--tool-parser" in done.stderr
