import pytest

from polar_mitm.providers.routes import Route, family_of, match_route


@pytest.mark.parametrize(
    "method,path,family,expected",
    [
        ("POST", "/v1/chat/completions", "openai", Route("generate", "openai_chat")),
        ("POST", "/compatible-mode/v1/chat/completions", "openai", Route("generate", "openai_chat")),
        ("POST", "/v1/responses", "openai", Route("generate", "openai_responses")),
        ("POST", "/v1/messages?beta=true", "anthropic", Route("generate", "anthropic")),
        ("POST", "/v1/messages/count_tokens?beta=true", "anthropic", Route("count_tokens", "anthropic")),
        ("POST", "/v1beta/models/gemini-2.5-pro:generateContent", "gemini",
         Route("generate", "gemini", "gemini-2.5-pro", False)),
        ("POST", "/v1beta/models/m:streamGenerateContent?alt=sse", "gemini", Route("generate", "gemini", "m", True)),
        ("POST", "/v1beta/models/m:countTokens", "gemini", Route("count_tokens", "gemini", "m", False)),
        ("GET", "/v1/models", "openai", Route("models", "openai_chat")),
        ("GET", "/v1/models", "anthropic", Route("models", "anthropic")),
        ("GET", "/v1beta/models/m", "gemini", Route("model", "gemini", "m")),
    ],
)
def test_llm_paths_map_to_their_api(method, path, family, expected):
    assert match_route(method, path, family) == expected


@pytest.mark.parametrize(
    "method,path",
    [("GET", "/"), ("POST", "/v1/files"), ("GET", "/api/claude_code/settings"), ("POST", "/v1/embeddings"),
     ("DELETE", "/v1/responses"), ("GET", "/v1/chat/completions")],
)
def test_other_paths_are_not_routes(method, path):
    assert match_route(method, path, "openai") is None


def test_family_from_host_then_headers():
    assert family_of("api.anthropic.com", {}) == "anthropic"
    assert family_of("127.0.0.1", {"x-api-key": "k"}) == "anthropic"
    assert family_of("127.0.0.1", {"x-goog-api-key": "k"}) == "gemini"
    assert family_of("127.0.0.1", {}, "/v1beta/models") == "gemini"
    assert family_of("127.0.0.1", {"authorization": "Bearer k"}) == "openai"
