"""The request side: what may pass (guard.py; egress.py, the connection-layer backstop), who is calling (auth.py),
and how much (quotas.py per session; fence.py holds new calls while a trainer syncs weights)."""
