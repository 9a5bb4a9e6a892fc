"""argparse types the CLIs share: a bad value is argparse's one line naming the flag, never a wait or a traceback
from deep inside (a negative timeout was waited out). A port's type is polar_serve.cli.port (the lowest floor)."""
from __future__ import annotations

import argparse
import math


def positive_seconds(text: str) -> float:
    """A finite number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return value
