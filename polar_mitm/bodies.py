"""The JSON bodies the proxy reads and sends over HTTP: a harness's request and an engine's answer in, an engine
request out. orjson for speed; the stdlib for what orjson gets wrong (an integer past 64 bits, which it reads as
a float) or refuses (an escaped lone surrogate, NaN, a lone surrogate to write). The proxy's own code: the
capture files' codec (polar_traj/captures.py) is the trajectory library's business, not the wire's."""
from __future__ import annotations

import json
import re
from array import array
from typing import Any

import orjson

# A run of 19 digits or more: maybe an integer orjson cannot hold. Digits are mapped to "0" and everything else
# to " " first, so one substring search (memchr speed) finds it.
_DIGITS_ONLY = bytes(0x30 if 0x30 <= i <= 0x39 else 0x20 for i in range(256))
_BIG_NUMBER = b"0" * 19
# A JSON escape of a UTF-16 surrogate: only then can the parsed body hold text the tokenizer cannot take.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def decode(raw: bytes) -> Any:
    """The JSON value of a body; ValueError (JSONDecodeError, UnicodeDecodeError) when it is not JSON."""
    if _BIG_NUMBER in raw.translate(_DIGITS_ONLY):
        return json.loads(raw)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def encode(value: Any) -> bytes:
    """A body's bytes; a prompt's ids held as array('i') go out as a JSON list."""
    try:
        return orjson.dumps(value, default=_ids_for_orjson, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError:
        return json.dumps(value, separators=(",", ":"), default=_ids_as_list).encode("ascii")


def _ids_for_orjson(value: Any) -> Any:
    if isinstance(value, array) and value.typecode == "i" and value.itemsize == 4:
        import numpy as np  # an int32 view of the array's own buffer: no list of ints is built

        return np.frombuffer(value, dtype=np.int32) if len(value) else []
    return _ids_as_list(value)


def _ids_as_list(value: Any) -> list[int]:
    if isinstance(value, array):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def has_surrogate_escape(raw: bytes) -> bool:
    # two substring searches rule out almost every body before the regex (~4 ns a byte) runs
    return (b"\\ud" in raw or b"\\uD" in raw) and _SURROGATE_ESCAPE.search(raw) is not None


def scrub_surrogates(value: Any) -> Any:
    """A copy with lone surrogates replaced by U+FFFD, what a lenient UTF-8 decoder gives the tokenizer."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [scrub_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {scrub_surrogates(k): scrub_surrogates(v) for k, v in value.items()}
    return value
