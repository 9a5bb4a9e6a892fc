"""Placement rules of polar_mitm/engines/replicas.py, without processes: which replica a session gets, when it moves,
and what a single engine does when it is marked down."""
from __future__ import annotations

import asyncio

import pytest

from polar_mitm.conversation import ProviderError
from polar_mitm.engines.client import Timeouts
from polar_mitm.engines.replicas import Engines, EnginePool
from polar_mitm.tokens.prompt import SessionHistory

A, B, C = "http://127.0.0.1:30000", "http://127.0.0.1:30001", "http://127.0.0.1:30002"


def engines(*urls: str, placement: str = "least_loaded") -> Engines:
    e = Engines()
    e.pool = EnginePool(urls, Timeouts(), placement)
    return e


def place(e: Engines, history: SessionHistory, tried: frozenset[str] = frozenset()) -> str:
    return asyncio.run(e.place(("t", "s"), history, tried)).url


def test_least_loaded_then_fewest_placed_and_sessions_stay():
    e = engines(A, B, C)
    e.pool.get(A).inflight = 2
    first, second = SessionHistory(), SessionHistory()
    assert place(e, first) == B  # B and C idle, B listed first
    assert place(e, second) == C  # idle too, fewer sessions placed
    e.pool.get(B).inflight = 5  # B gets busy: its session still stays there
    assert place(e, first) == B and not first.moved


def test_round_robin_takes_turns():
    e = engines(A, B, placement="round_robin")
    assert [place(e, SessionHistory()) for _ in range(4)] in ([B, A, B, A], [A, B, A, B])


def test_a_session_on_a_down_replica_moves_and_its_chain_restarts():
    e = engines(A, B)
    history = SessionHistory()
    assert place(e, history) == A
    e.pool.mark_down(e.pool.get(A), "connection refused")
    assert place(e, history) == B and history.moved and history.engine == B
    e.pool.mark_up(e.pool.get(A))
    assert place(e, history) == B  # moved sessions stay; A takes new ones
    assert place(e, SessionHistory()) == A


def test_a_single_engine_marked_down_keeps_its_sessions_chains():
    e = engines(A)
    history = SessionHistory()
    place(e, history)
    e.pool.mark_down(e.pool.get(A), "engine timeout after 600 s")
    assert place(e, history) == A and not history.moved  # nothing to move to: tried anyway, chain kept
    with pytest.raises(ProviderError, match="no inference engine answered"):
        place(e, history, tried=frozenset({A}))


def test_when_no_replica_is_up_a_session_stays_and_keeps_its_chain():
    e = engines(A, B)
    history = SessionHistory()
    assert place(e, history) == A
    for r in e.pool.replicas:  # e.g. every engine restarting after a weight reload
        e.pool.mark_down(r, "health probe answered 503")
    assert [place(e, history) for _ in range(3)] == [A, A, A] and not history.moved
    assert place(e, SessionHistory()) in (A, B)  # a new session is still placed (the probes may be stale)
    assert place(e, history, tried=frozenset({A})) == B and history.moved  # A failed this very call: it moves


def test_probes_do_not_mark_down_a_replica_that_never_answered_during_the_start_grace():
    async def probe_twice(grace_s: float) -> EnginePool:
        pool = EnginePool((A, B), Timeouts(), grace_s=grace_s)  # nothing listens there yet
        await pool.probe_all()
        await pool.probe_all()
        await pool.close()
        return pool

    starting = asyncio.run(probe_twice(30))
    assert all(r.up for r in starting.replicas) and starting.replicas[0].state.startswith("not answering yet (health")
    late = asyncio.run(probe_twice(0))
    assert not any(r.up for r in late.replicas) and "ClientConnectorError" in late.replicas[0].why_down
