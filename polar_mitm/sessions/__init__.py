"""Rollout sessions as the proxy knows them: the registry that maps credentials to a session (registry.py), the
sampling a trainer fixes for it (sampling.py), and its bounded per-session state (cache.py)."""
