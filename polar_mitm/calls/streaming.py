"""Live streaming: the engine's token stream, translated chunk by chunk into the provider's SSE. Translation
only: the call's owner (calls/owner.py) ends the stream and records it."""
from __future__ import annotations

import logging
from typing import Any, Callable

from polar_mitm.calls.call import Call
from polar_mitm.conversation import Completion, ProviderError, ReplyEvent
from polar_mitm.engines.api import EngineError, SSEDecoder
from polar_mitm.engines.chat import NO_PROMPT_IDS
from polar_mitm.providers import CODECS

log = logging.getLogger(__name__)


def incomplete(call: Call) -> str | None:
    """Why a stream that ended without an error of its own still did not deliver a whole call, if it did not."""
    if call.output.finish_reason is None:
        return "engine stream ended before the last token"
    if call.prompt is None:
        return NO_PROMPT_IDS
    return None


class StreamTranslator:
    """Engine stream bytes in, provider SSE bytes out: `start()`, `feed(chunk)` per read, then the reply's
    last events (`encode`) and its end (`finish`) or an error event (`error_event`). A chunk the translator
    cannot read sets `error`, after which it takes nothing more."""

    def __init__(self, call: Call, take: Callable[[dict[str, Any]], list[ReplyEvent]]) -> None:
        self.call, self.take = call, take  # take: one engine chunk into the call, its reply's events
        codec = CODECS[call.route.api]
        self.encoder = codec.StreamEncoder(call.call_id, call.conv.model,
                                           prompt_tokens=len(call.prompt.ids) if call.prompt else 0,
                                           **codec.encoder_options(call.request_body))
        self.sse = SSEDecoder()
        self.error: str | None = None

    def start(self) -> bytes:
        return self.encoder.start()

    def feed(self, chunk: bytes) -> bytes:
        if self.error:
            return b""
        out = []
        try:
            for data in self.sse.feed(chunk):
                out += [self.encoder.feed(event) for event in self.take(data)]
        except (EngineError, ValueError) as e:
            self.error = f"engine stream failed: {e}"
        return b"".join(out)

    def encode(self, events: list[ReplyEvent]) -> bytes:
        return b"".join(self.encoder.feed(e) for e in events)

    def finish(self, completion: Completion) -> bytes:
        return self.encoder.finish(completion)

    def error_event(self, message: str, status: int = 502, kind: str = "api_error") -> bytes:
        log.error("polar: call %s: %s", self.call.call_id, message)
        return self.encoder.fail(ProviderError(status, f"polar: {message}", kind))
