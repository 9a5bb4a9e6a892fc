#!/usr/bin/env bash
# Make sure a Redis answers PING on 127.0.0.1:6379; if none does, start Debian's redis-server there,
# bound to loopback only, with persistence (appendonly yes: a restart keeps queued stages and batch state),
# its pid/log/append-only files under .cache/. It also listens on the
# unix socket .cache/redis.sock, which stays reachable from a loopback-only network namespace (the tests').
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

host=127.0.0.1 port=6379
pong() { timeout 2 bash -c "exec 3<>/dev/tcp/$host/$port && printf 'PING\r\n' >&3 && head -c 5 <&3" 2>/dev/null \
           | grep -q '+PONG'; }

cache=$PWD/.cache
sock=$cache/redis.sock
if pong; then
  if [ -S "$sock" ]; then info "already answering on $host:$port and $sock"; step_status skipped; exit 0; fi
  if [ "$(redis-cli -h "$host" -p "$port" --raw config get unixsocket 2>/dev/null | sed -n 2p)" != "$sock" ]; then
    info "already answering on $host:$port (not started here: no $sock for loopback-only namespaces)"; step_status skipped; exit 0
  fi
  info "our redis-server lost its socket $sock (.cache removed?): restarting it"
  redis-cli -h "$host" -p "$port" shutdown nosave > /dev/null 2>&1 || true
  for _ in $(seq 50); do pong || break; sleep 0.1; done
fi
command -v redis-server > /dev/null || die "redis-server not installed (run scripts/setup_apt.sh)"
info "starting redis-server on $host:$port (log: .cache/redis.log)"
redis-server --bind "$host" --port "$port" --protected-mode yes --save '' --appendonly yes \
  --unixsocket "$sock" --unixsocketperm 770 \
  --daemonize yes --pidfile "$cache/redis.pid" --logfile "$cache/redis.log" --dir "$cache" \
  || die "redis-server did not start; see .cache/redis.log"
for _ in $(seq 50); do
  if pong; then step_status started; info "answering (pid $(cat "$cache/redis.pid" 2>/dev/null || echo '?'))"; exit 0; fi
  sleep 0.1
done
tail -n 20 "$cache/redis.log" >&2 || true
die "redis-server started but does not answer PING on $host:$port"
