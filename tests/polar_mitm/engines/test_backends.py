"""The engines' option values of polar_mitm/engines/backends.py."""
from __future__ import annotations

import pytest

from polar_mitm.engines.backends import parse_backends

A, B = "http://127.0.0.1:30000", "http://127.0.0.1:30001"


def test_parse_backends_takes_a_list_and_refuses_repeats_and_junk():
    assert parse_backends(f"{A}/, {B}") == (A, B)
    for bad, why in ((f"{A},{A}", "twice"), ("", "at least one"), ("127.0.0.1:1", "http://host:port")):
        with pytest.raises(ValueError, match=why):
            parse_backends(bad)
