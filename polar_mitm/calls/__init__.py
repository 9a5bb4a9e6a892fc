"""One LLM call in flight: its state from request to record (call.py), its engine side (dispatch.py), the stream
relay mitmproxy connects to (relay.py), and the engine's token stream as the provider's SSE (streaming.py)."""
