"""`polar api`: the rollout service over HTTP (docs/api.md). The server is stateless apart from Redis."""
