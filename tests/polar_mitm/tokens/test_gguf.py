"""A model given as a .gguf file: the proxy converts its tokenizer once, in a child Python (the proxy runs without
torch), and the result tokenizes as transformers' own reading of the file does. Uses the real SmolLM2 135M GGUF
(scripts/fetch_models.sh)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from polar_mitm.cli import model_mismatch, model_names
from polar_mitm.tokens import gguf
from polar_mitm.tokens.model import load_model
from tests.conftest import ROOT
from tests.polar.harness.test_real_model import SMOLLM2 as GGUF

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Ünïcödé, tabs\tand 日本語?"},
        {"role": "assistant", "content": "Yes."}, {"role": "user", "content": "  spaces  "}]


def test_a_gguf_tokenizer_is_transformers_own_reading_of_the_file(tmp_path, monkeypatch):
    assert GGUF.is_file(), f"{GGUF}: run `make setup`"
    from transformers import AutoTokenizer

    monkeypatch.setenv("POLAR_GGUF_CACHE", str(tmp_path / "cache"))
    model = load_model(str(GGUF))
    direct = AutoTokenizer.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name)
    for chat in (CHAT[:2], CHAT):
        want = direct.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        assert model.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) == want
        assert model.tokenizer.encode(want, add_special_tokens=False) == direct.encode(want, add_special_tokens=False)
    assert model.served_names == ("smollm2",)  # the directory's name, as an engine serving the file is named
    assert model.context_length == 8192 and model.stop_ids == {direct.convert_tokens_to_ids("<|im_end|>")}

    (made,) = (tmp_path / "cache").iterdir()
    stamp = (made / ".complete").stat().st_mtime_ns
    assert gguf.tokenizer_dir(GGUF) == made and (made / ".complete").stat().st_mtime_ns == stamp  # once per file


def test_a_file_that_is_not_gguf_is_refused_and_leaves_nothing_half_made(tmp_path):
    bad = tmp_path / "model" / "broken.gguf"
    bad.parent.mkdir()
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(ValueError, match="cannot read the tokenizer in .*broken.gguf"):
        gguf.tokenizer_dir(bad, cache=tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []


def test_an_engine_serving_a_gguf_file_is_named_by_its_directory():
    reports = {"/get_model_info": {"model_path": "/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}}
    assert model_names(reports) == ["smollm2"]
    assert model_mismatch("http://127.0.0.1:1", ["smollm2"], GGUF) is None
    assert "every recorded token id is wrong" in model_mismatch("http://127.0.0.1:1", ["qwen3"], GGUF)


@pytest.mark.parametrize("model, message", [("missing.gguf", "no such file"),
                                            ("fixtures", "no config.json) or a .gguf file")])
def test_polar_serve_says_what_it_takes(model, message):
    done = subprocess.run([sys.executable, "-m", "polar_serve", "serve", "--model", model, "--port", "0"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr, done.stderr
