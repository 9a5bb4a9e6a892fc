"""polar_mitm: the mitmproxy addon that serves and records LLM calls token-exactly."""
