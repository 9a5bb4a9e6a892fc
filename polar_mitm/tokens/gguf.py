"""A model given as one .gguf file: its tokenizer, chat template and config as a Hugging Face directory, made once
per file under ~/.cache/polar/gguf/ (POLAR_GGUF_CACHE). transformers reads GGUF only with torch and gguf
installed, and the proxy's own process runs without torch (model.without_torch), so a child Python converts the
file; the proxy then loads the directory as any other."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

DEFAULT_CACHE = "~/.cache/polar/gguf"
CONVERT_TIMEOUT_S = 600


def model_name(path: Path) -> str:
    """A model's name: its directory's. A .gguf file is named by the directory it lies in, both as a tokenizer
    and in an engine's report of the file it serves."""
    return (path.parent if path.suffix == ".gguf" else path).name


def cache_root() -> Path:
    return Path(os.environ.get("POLAR_GGUF_CACHE") or DEFAULT_CACHE).expanduser()


def tokenizer_dir(path: Path, cache: Path | None = None) -> Path:
    """The converted directory of a .gguf file (made now if missing); ValueError with the reason when it cannot
    be. Keyed by the file's path, size and mtime: a file replaced in place is converted again."""
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:16]
    root = cache or cache_root()
    out = root / f"{path.stem}-{key}"
    if (out / ".complete").is_file():
        return out
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".partial-", dir=root))  # never read as whole: renamed when done
    try:
        done = subprocess.run([sys.executable, "-m", "polar_mitm.tokens.gguf", str(path), str(tmp)],
                              capture_output=True, text=True, timeout=CONVERT_TIMEOUT_S)
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines()
            raise ValueError(f"cannot read the tokenizer in {path}: {lines[-1] if lines else done.returncode}")
        (tmp / ".complete").touch()
        try:
            tmp.rename(out)
        except OSError:  # another process converted it first: theirs is as good
            if not (out / ".complete").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def convert(src: Path, dst: Path) -> None:
    """In the child: the GGUF file's tokenizer (its chat template included) and model config, saved to dst."""
    try:
        import gguf  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        sys.exit(f"a .gguf model needs torch and gguf installed ({e}): pip install 'polar[serve]', or give the "
                 "model's directory instead")
    from transformers import AutoConfig, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    where = {"pretrained_model_name_or_path": str(src.parent), "gguf_file": src.name, "local_files_only": True}
    AutoTokenizer.from_pretrained(**where).save_pretrained(dst)
    AutoConfig.from_pretrained(**where).save_pretrained(dst)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
