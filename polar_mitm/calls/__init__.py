"""One LLM call in flight: its owner from request to record (owner.py), its state (call.py), its engine side
(dispatch.py), the stream relay mitmproxy connects to (relay.py), and the engine's tokens as the provider's SSE
(streaming.py)."""
