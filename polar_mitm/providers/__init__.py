"""Provider codecs: one module per API, all with the same interface; beside them, which API a request path
speaks (routes.py) and mitmproxy answers in a provider's own shape (responses.py).

    API: str
    parse_request(body: dict, path: str) -> Conversation            # raises ProviderError(400, …)
    encoder_options(body: dict) -> dict                              # extra StreamEncoder kwargs
    render_response(completion: Completion, **encoder_options(body)) -> dict
    StreamEncoder(completion_id, model, *, prompt_tokens=0, **encoder_options(body))
        .start() -> bytes, .feed(event) -> bytes, .finish(completion) -> bytes, .fail(err) -> bytes
    render_error(err: ProviderError) -> dict
    render_models(model_ids) -> dict                                 # plus render_count_tokens where the API has it
"""
from __future__ import annotations

from types import ModuleType

from polar_mitm.providers import anthropic, gemini, openai_chat, openai_responses

CODECS: dict[str, ModuleType] = {m.API: m for m in (openai_chat, openai_responses, anthropic, gemini)}


def codec(api: str) -> ModuleType:
    """The codec module for an `api` name (`openai_chat|openai_responses|anthropic|gemini`)."""
    try:
        return CODECS[api]
    except KeyError:
        raise ValueError(f"unknown api {api!r}; expected one of {sorted(CODECS)}") from None
