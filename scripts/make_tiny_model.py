"""Regenerate fixtures/tiny-qwen2: a byte-level BPE (vocab 1024), a ChatML chat template with tools and
reasoning, and a randomly initialised Qwen2ForCausalLM. Deterministic: running it twice gives the same bytes.

    .venv/bin/python scripts/make_tiny_model.py [--out DIR] [--seed N]
    .venv/bin/python scripts/make_tiny_model.py --from-tokenizer .tools/tokenizers/qwen3 --out DIR

--from-tokenizer: random tiny Qwen3 weights for another model's real tokenizer and chat template (a family's
tokenizer fetched by scripts/fetch_tokenizers.sh), so the reference server samples ids of that vocabulary and the
proxy renders that family's template (tests/polar_mitm/test_proxy_real_templates.py). Qwen3 rather than Qwen2
because of the gotcha below: for `qwen3` transformers keeps the tokenizer class the tokenizer declares.

docs/design.md §6 gotcha: transformers 5 loads this directory with Qwen2Tokenizer (chosen from config.model_type),
which rebuilds the normalizer and pre-tokenizer itself; we train with exactly those so the ids agree, and check.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "fixtures" / "tiny-qwen2"
VOCAB_SIZE = 1024
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>", "</think>"]
# Never split, but not "special" for decoding: skip_special_tokens keeps the tool-call and reasoning markup in the
# text (as Qwen2.5/Qwen3 mark them), so a reply's text still shows its <tool_call> blocks.
MARKUP_TOKENS = SPECIAL_TOKENS[3:]
EOS, PAD = "<|im_end|>", "<|endoftext|>"
# Qwen2's split regex, as transformers' Qwen2Tokenizer sets it.
QWEN2_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# ChatML with tools in the system turn (hermes/Qwen style). Reasoning is rendered in *every* assistant turn so a
# conversation re-rendered with one more turn extends the previous token stream (the proxy relies on this).
CHAT_TEMPLATE = r"""{%- macro text(content) -%}
{%- if content is none or content is undefined -%}
{%- elif content is string -%}{{- content -}}
{%- elif content is mapping -%}{{- content.text if content.text is defined else '' -}}
{%- else -%}{%- for part in content -%}{%- if part.type == 'text' -%}{{- part.text -}}{%- endif -%}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- set has_system = messages and messages[0].role == 'system' -%}
{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if has_system -%}{{- text(messages[0].content) + '\n\n' -}}{%- endif -%}
{{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n' -}}
{{- tools | tojson -}}
{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif has_system -%}
{{- '<|im_start|>system\n' + text(messages[0].content) + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
{%- if loop.first and message.role == 'system' -%}
{%- elif message.role == 'tool' -%}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
{{- '\n<tool_response>\n' + text(message.content) + '\n</tool_response>' -}}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
{%- elif message.role == 'assistant' -%}
{{- '<|im_start|>assistant\n' -}}
{%- if message.reasoning_content is defined and message.reasoning_content is not none -%}
{{- '<think>\n' + message.reasoning_content + '\n</think>\n\n' -}}
{%- endif -%}
{%- set content = text(message.content) -%}
{{- content -}}
{%- if message.tool_calls -%}
{%- for call in message.tool_calls -%}
{%- set fn = call.function if call.function is defined else call -%}
{%- if content or not loop.first -%}{{- '\n' -}}{%- endif -%}
{{- '<tool_call>\n{"name": "' + fn.name + '", "arguments": ' -}}
{%- if fn.arguments is string -%}{{- fn.arguments -}}{%- else -%}{{- (fn.arguments if fn.arguments is defined else {}) | tojson -}}{%- endif -%}
{{- '}\n</tool_call>' -}}
{%- endfor -%}
{%- endif -%}
{{- '<|im_end|>\n' -}}
{%- else -%}
{{- '<|im_start|>' + message.role + '\n' + text(message.content) + '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""

# Training text: prose, code, JSON tool calls, shell and ChatML, so common agent traffic tokenizes compactly.
CORPUS = [
    "The quick brown fox jumps over the lazy dog. A coding agent reads files, runs commands and edits code.",
    "Polar turns coding agents into reinforcement learning environments. Every call is recorded token by token.",
    "You are a helpful assistant. Answer the question, then stop. If a tool can help, call the tool first.",
    "Please write a file named hello.txt that contains the word hello, then tell me when you are done.",
    "The tests pass. I created the file and checked its contents. Done.",
    "Read the README, install the dependencies, and run the test suite before you change anything.",
    "def main(argv: list[str] | None = None) -> int:\n    args = parse_args(argv)\n    return run(args)\n",
    "import json\nimport os\nfrom pathlib import Path\n\nwith open(path, encoding=\"utf-8\") as f:\n    data = json.load(f)\n",
    "class Config:\n    def __init__(self, name: str, value: int = 0) -> None:\n        self.name = name\n        self.value = value\n",
    "for i in range(10):\n    if i % 2 == 0:\n        print(f\"even {i}\")\n    else:\n        continue\n",
    "function add(a, b) {\n  return a + b;\n}\nconst result = await fetch(url, { method: \"POST\" });\n",
    "$ ls -la\n$ cd /workspace && git status\n$ echo hello > hello.txt\n$ cat hello.txt\nhello\n",
    "bash -lc 'python -m pytest -q tests/'\ngrep -rn \"TODO\" src/ | head -20\nmkdir -p out && cp a.txt out/\n",
    "pip install -e . && make test\nsed -n 1,40p main.py\nfind . -name '*.py' -type f | wc -l\n",
    '{"name": "shell", "arguments": {"command": "echo hello > hello.txt"}}',
    '{"name": "exec_command", "arguments": {"cmd": "ls -la"}}',
    '{"name": "Bash", "arguments": {"command": "cat README.md", "description": "Read the readme"}}',
    '{"name": "read_file", "arguments": {"path": "src/main.py"}}',
    '{"type": "function", "function": {"name": "run_shell_command", "description": "Run a shell command", '
    '"parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}',
    '{"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{\\"command\\": \\"pwd\\"}"}}',
    "<|im_start|>system\nYou are a coding agent.<|im_end|>\n<|im_start|>user\nList the files.<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nI should list the files.\n</think>\n\n<tool_call>\n"
    '{"name": "shell", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\n<tool_response>\nREADME.md\nsetup.cfg\nsrc\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\nThere are three entries: README.md, setup.cfg and src.<|im_end|>\n",
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n",
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14 -1 0x1f; punctuation: ( ) [ ] { } < > = + - * / % & | ^ ~ ! ? : ;",
    "Errors: Traceback (most recent call last):\n  File \"main.py\", line 3, in <module>\nValueError: bad value\n",
    "HTTP/1.1 200 OK\nContent-Type: application/json\n\n{\"ok\": true, \"items\": [1, 2, 3], \"next\": null}\n",
    "Summary: the change adds a reference server, a tiny model and tests. Next steps: review, merge, release.",
    "git diff --stat\ngit add -A && git commit -m \"Fix parser\"\ngit log --oneline -5\nrm -rf build dist\n",
    "Bonjour, ça va? Größe, naïve café, 東京, Привет. Unicode text must round-trip through the byte-level BPE.",
]


def train_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
                               byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=2, show_progress=False,
                                  special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 8, trainer=trainer)
    assert tok.get_vocab_size() <= VOCAB_SIZE, tok.get_vocab_size()
    return tok


def tokenizer_json(tok: Tokenizer) -> str:
    data = json.loads(tok.to_str())
    for added in data["added_tokens"]:
        added["special"] = added["content"] not in MARKUP_TOKENS
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def tokenizer_config(tok: Tokenizer) -> dict:
    added = {str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                       "single_word": False, "special": t not in MARKUP_TOKENS}
             for t in SPECIAL_TOKENS}
    return {
        "tokenizer_class": "Qwen2Tokenizer",
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": 4096,
        "split_special_tokens": False,
    }


def init_weights(model: torch.nn.Module, seed: int) -> None:
    # Explicit init from our own generator (not transformers' _init_weights) so the bytes depend only on the seed.
    # Scales chosen so greedy output is varied (not one repeated token) while float32 logits stay small enough
    # that KV-cache decoding agrees with a full forward pass to ~4e-6 in logprob (tests compare at 1e-5).
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith("bias"):
                param.copy_(torch.randn(param.shape, generator=gen) * 0.1)
            elif "embed_tokens" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.1)
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * 2.0 / param.shape[-1] ** 0.5)


def build_model(tok: Tokenizer, seed: int):
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    eos_id, pad_id = tok.token_to_id(EOS), tok.token_to_id(PAD)
    config = Qwen2Config(
        vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True,
        bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id, use_sliding_window=False, dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).eval()
    init_weights(model, seed)
    model.generation_config = GenerationConfig(bos_token_id=pad_id, eos_token_id=[eos_id, pad_id],
                                               pad_token_id=pad_id, do_sample=False)
    return model


# The stop tokens of a family's real generation_config.json, where the tokenizer's eos is not all of them
# (gpt-oss stops at a tool call's <|call|> and at <|endoftext|> too).
FAMILY_STOPS = {"<|return|>": ("<|return|>", "<|endoftext|>", "<|call|>"),  # gpt-oss
               "<|eot_id|>": ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")}  # Llama 3.1 (3.0 has no eom)


def write_for_tokenizer(tokenizer_dir: Path, out: Path, seed: int = 0) -> Path:
    """`out`: the tokenizer files of `tokenizer_dir` and a random tiny Qwen3 model over its whole vocabulary;
    generation_config.json stops where the family's real one does. Qwen3, not Qwen2: transformers 5 loads the
    tokenizer of a `qwen2` model directory as Qwen2's whatever its tokenizer_config.json says (and so rebuilt
    another family's pre-tokenizer: gpt-oss's digits one by one), while for `qwen3` it keeps the declared class;
    checked below, the directory's AutoTokenizer must give the source's ids."""
    from transformers import AutoTokenizer, GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    auto = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tokenizer_dir / name).is_file():
            shutil.copyfile(tokenizer_dir / name, out / name)
    eos = auto.eos_token_id
    pad = auto.pad_token_id if auto.pad_token_id is not None else eos
    config = Qwen3Config(
        vocab_size=len(auto), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=32768, tie_word_embeddings=True,
        bos_token_id=pad, eos_token_id=eos, pad_token_id=pad, use_sliding_window=False, dtype="float32")
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).eval()
    init_weights(model, seed)
    known = auto.get_vocab()
    stops = [known[t] for t in FAMILY_STOPS.get(auto.eos_token, ()) if t in known] or eos
    model.generation_config = GenerationConfig(eos_token_id=stops, pad_token_id=pad, do_sample=False)
    model.save_pretrained(out, safe_serialization=True)
    probe = "Knowledge cutoff: 2024-06\n\n  héllo wörld 日本語 <think> x=1;\ty"
    got = AutoTokenizer.from_pretrained(str(out)).encode(probe, add_special_tokens=False)
    if got != auto.encode(probe, add_special_tokens=False):
        raise RuntimeError(f"{out}: its tokenizer encodes otherwise than {tokenizer_dir}'s")
    return out


def check(out: Path, tok: Tokenizer) -> None:
    """AutoTokenizer (Qwen2Tokenizer, rebuilt pipeline) must give the ids tokenizer.json gives."""
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(out)
    assert type(auto).__name__ == "Qwen2Tokenizer", type(auto).__name__
    raw = Tokenizer.from_file(str(out / "tokenizer.json"))
    samples = CORPUS + ["  leading spaces\n\n\ttabs\r\nand 12345 digits don't", "<|im_start|>user\nhi<|im_end|>"]
    for text in samples:
        want = raw.encode(text, add_special_tokens=False).ids
        got = auto.encode(text, add_special_tokens=False)
        assert got == want, (text, got, want)
        assert auto.decode(got) == text, text
    assert auto.eos_token == EOS and auto.pad_token == PAD, (auto.eos_token, auto.pad_token)
    markup = "<think>\nx\n</think>\n\n<tool_call>\n{}\n</tool_call><|im_end|>"
    assert auto.decode(auto.encode(markup), skip_special_tokens=True) == markup[: -len(EOS)], "markup must survive"


def write(out: Path, seed: int) -> None:
    tok = train_tokenizer()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / "tokenizer.json").write_text(tokenizer_json(tok))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(tok), indent=2) + "\n")
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    build_model(tok, seed).save_pretrained(out, safe_serialization=True)
    for path in out.iterdir():
        path.chmod(0o644)  # safetensors writes 0600; keep the committed fixture readable
    check(out, tok)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--seed", type=int, default=0, help="weight init seed (the tokenizer does not depend on it)")
    parser.add_argument("--from-tokenizer", type=Path, metavar="DIR",
                        help="random tiny weights for this tokenizer directory instead (its template too)")
    args = parser.parse_args(argv)
    if args.from_tokenizer:
        write_for_tokenizer(args.from_tokenizer, args.out, args.seed)
    else:
        write(args.out, args.seed)
    total = 0
    for path in sorted(args.out.iterdir()):
        data = path.read_bytes()
        total += len(data)
        print(f"{path.name:28s} {len(data):8d}  {hashlib.sha256(data).hexdigest()[:16]}")
    print(f"{'total':28s} {total:8d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
