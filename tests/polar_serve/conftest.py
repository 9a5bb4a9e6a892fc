"""The tiny model loaded in-process with plain transformers: the reference the server's numbers are checked against."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
TOOLS = [{"type": "function", "function": {
    "name": "Bash", "description": "Run a shell command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


@pytest.fixture(scope="session")
def hf_tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def hf_model(tiny_model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def forward_logprobs(hf_model: Any) -> Callable[[list[int], list[int]], list[float]]:
    """Logprobs of output_ids given prompt_ids from ONE plain forward pass (no cache, no sampling)."""
    def run(prompt_ids: list[int], output_ids: list[int], model: Any = None) -> list[float]:
        with torch.inference_mode():
            logits = (model or hf_model)(input_ids=torch.tensor([prompt_ids + output_ids])).logits[0]
        rows = torch.log_softmax(logits.float(), dim=-1)[len(prompt_ids) - 1: -1]
        return [float(rows[i, t]) for i, t in enumerate(output_ids)]

    return run


@pytest.fixture(scope="session")
def chat_ids(hf_tokenizer: Any) -> Callable[..., list[int]]:
    def render(messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        return list(hf_tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                                     tokenize=True, return_dict=False))

    return render
