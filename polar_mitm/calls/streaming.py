"""Live streaming: the engine's token stream, translated chunk by chunk into the provider's SSE."""
from __future__ import annotations

import logging
from typing import Awaitable, Callable

from polar_mitm.calls.call import Call, completion_of, feed_ids, finish_events, rendered_by_engine, take_chat
from polar_mitm.capture import CaptureError
from polar_mitm.conversation import ProviderError
from polar_mitm.engines.api import EngineError, SSEDecoder, apply_chunk
from polar_mitm.engines.chat import NO_PROMPT_IDS
from polar_mitm.providers import CODECS

log = logging.getLogger(__name__)


class StreamTranslator:
    """Engine stream bytes in, provider SSE bytes out: `feed(chunk)` per read, then `end()` once.

    `end()` writes the record and updates the session history (through `settle`) before the last bytes go
    out, so the harness's next request always finds this call. A stream that fails ends with the provider's
    error event, and its record keeps the tokens received so far, flagged `truncated`."""

    def __init__(self, engine: str, call: Call, model, settle: Callable[..., Awaitable[None]]) -> None:
        self.engine, self.call, self.model, self.settle = engine, call, model, settle
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
                if rendered_by_engine(self.call):
                    events = take_chat(self.call, data)
                else:
                    have = len(self.call.output.output_ids)
                    apply_chunk(self.engine, data, self.call.output)
                    events = feed_ids(self.call, self.call.output.output_ids[have:], self.model.stop_ids)
                out += [self.encoder.feed(event) for event in events]
        except (EngineError, ValueError) as e:
            self.error = f"engine stream failed: {e}"
        return b"".join(out)

    async def end(self) -> bytes:
        out: list[bytes] = []
        try:
            out = [self.encoder.feed(e) for e in finish_events(self.call)]
            if self.error is None and self.call.output.finish_reason is None:
                self.error = "engine stream ended before the last token"
            if self.error is None and self.call.prompt is None:
                self.error = NO_PROMPT_IDS
            if self.error and "truncated" not in self.call.flags:
                self.call.flags.append("truncated")
            completion = completion_of(self.call, self.model.stop_ids)
            codec = CODECS[self.call.route.api]
            body = codec.render_response(completion, **codec.encoder_options(self.call.request_body))
            await self.settle(self.call, completion, body, self.error)
        except Exception as e:  # a parser, encoder or capture failure still ends in a record and an error event
            if not isinstance(e, CaptureError):
                log.exception("polar: call %s: finishing the reply failed", self.call.call_id)
            self.error = str(e) if isinstance(e, CaptureError) else f"internal error finishing the reply ({type(e).__name__})"
            await self._record_error()
            return b"".join(out) + self.error_event(self.error)
        if self.error:
            return b"".join(out) + self.error_event(self.error)
        return b"".join(out) + self.encoder.finish(completion)

    async def _record_error(self) -> None:
        if self.call.recorded:
            return
        try:
            await self.settle(self.call, None, None, self.error)
        except Exception:
            log.exception("polar: call %s: the error record could not be written either", self.call.call_id)

    def error_event(self, message: str, status: int = 502, kind: str = "api_error") -> bytes:
        log.error("polar: call %s: %s", self.call.call_id, message)
        return self.encoder.fail(ProviderError(status, f"polar: {message}", kind))
