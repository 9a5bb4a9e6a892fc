"""Live streaming: the engine's token stream, translated chunk by chunk into the provider's SSE."""
from __future__ import annotations

import logging
from typing import Callable

from polar_mitm.call import Call, feed_ids, finish_events
from polar_mitm.capture import CaptureError
from polar_mitm.conversation import Completion, ProviderError
from polar_mitm.engine import EngineError, SSEDecoder, apply_chunk
from polar_mitm.providers import CODECS

log = logging.getLogger(__name__)


class StreamTranslator:
    """mitmproxy's `flow.response.stream` callable: called once per upstream read, then with b"" at the end.

    The record is written and the session history updated inside the final call, before the last
    bytes go out, so the harness's next request always finds this call.
    """

    def __init__(self, engine: str, call: Call, model, finish: Callable[[Call, str | None], Completion]) -> None:
        self.engine, self.call, self.model, self.finish = engine, call, model, finish
        codec = CODECS[call.route.api]
        self.encoder = codec.StreamEncoder(call.call_id, call.conv.model, prompt_tokens=len(call.prompt.ids),
                                          **codec.encoder_options(call.request_body))
        self.sse = SSEDecoder()
        self.started = False
        self.error: str | None = None

    def __call__(self, chunk: bytes) -> list[bytes]:
        # A list, never b"": mitmproxy would send an empty bytes as the terminating chunk.
        out = [] if self.started else [self.encoder.start()]
        self.started = True
        if chunk:
            out.extend(self._translate(chunk))
        else:
            out.append(self._end())
        return [b for b in out if b]

    def _translate(self, chunk: bytes) -> list[bytes]:
        if self.error:
            return []
        out = []
        try:
            for data in self.sse.feed(chunk):
                have = len(self.call.output.output_ids)
                apply_chunk(self.engine, data, self.call.output)
                for event in feed_ids(self.call, self.call.output.output_ids[have:], self.model.stop_ids):
                    out.append(self.encoder.feed(event))
        except (EngineError, ValueError) as e:
            self.error = f"engine stream failed: {e}"
        return out

    def _end(self) -> bytes:
        out = [self.encoder.feed(e) for e in finish_events(self.call)]
        if self.error is None and self.call.output.finish_reason is None:
            self.error = "engine stream ended before the last token"
        try:
            completion = self.finish(self.call, self.error)
        except CaptureError as e:
            self.error = str(e)
            return b"".join(out) + self._error_event(self.error)
        if self.error:
            return b"".join(out) + self._error_event(self.error)
        out.append(self.encoder.finish(completion))
        return b"".join(out)

    def _error_event(self, message: str) -> bytes:
        log.error("polar: call %s: %s", self.call.call_id, message)
        return self.encoder.fail(ProviderError(502, f"polar: {message}", "api_error"))
