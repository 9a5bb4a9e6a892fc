"""The engine alone: start the reference server on 127.0.0.1, send one chat request to SGLang's /generate, and print
every sampled token with its id and logprob. Runs offline on the committed tiny model.

    .venv/bin/python scripts/demo.py [--model DIR] [--max-new-tokens N]
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from polar_serve.launch import reference_server  # noqa: E402

CONVERSATION = [
    {"role": "system", "content": "You are a coding agent. Use the shell tool when it helps."},
    {"role": "user", "content": "Create hello.txt containing the word hello."},
]
TOOLS = [{"type": "function", "function": {
    "name": "shell", "description": "Run a shell command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


def render_prompt(model: Path) -> list[int]:
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    tokenizer = AutoTokenizer.from_pretrained(model)
    return list(tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, add_generation_prompt=True,
                                              tokenize=True, return_dict=False))


def print_table(response: dict) -> None:
    rows = response["meta_info"]["output_token_logprobs"]
    print(f"{'#':>3}  {'id':>5}  {'logprob':>9}  {'prob':>7}  token")
    for i, (logprob, token_id, text) in enumerate(rows):
        print(f"{i:>3}  {token_id:>5}  {logprob:>9.4f}  {math.exp(logprob):>7.4f}  {text!r}")
    total = sum(lp for lp, _, _ in rows)
    print(f"sum of logprobs {total:.4f} over {len(rows)} tokens")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=ROOT / "fixtures" / "tiny-qwen2")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    args = parser.parse_args(argv)

    prompt_ids = render_prompt(args.model)
    print(f"== starting the reference server on {args.model.name} (127.0.0.1, a free port)")
    with reference_server(args.model) as base:
        print(f"== {base}: POST /generate with a {len(prompt_ids)}-token chat prompt (ChatML + tools)")
        body = {"input_ids": prompt_ids, "return_logprob": True, "return_text_in_logprobs": True,
                "sampling_params": {"temperature": 0, "max_new_tokens": args.max_new_tokens,
                                    "skip_special_tokens": False}}
        t0 = time.perf_counter()
        response = httpx.post(f"{base}/generate", json=body, timeout=60).raise_for_status().json()
        elapsed = time.perf_counter() - t0
    meta = response["meta_info"]
    print(f"== reply ({meta['completion_tokens']} tokens in {elapsed * 1000:.0f} ms, finish {meta['finish_reason']}, "
          f"weight_version {meta['weight_version']}):\n{response['text']!r}\n")
    print_table(response)
    print("== server stopped. (A random tiny model: the words are noise, the numbers are exact.)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
