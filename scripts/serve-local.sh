#!/usr/bin/env bash
# Set up (if needed) and run the local CPU deployment in the foreground: the gateway and 2 vLLM CPU replicas
# of the tiny model on http://127.0.0.1:8000, with a local Redis for the global queue unless REDIS_URL is set.
# Arguments: another config file, then extra `serve run` arguments. Ctrl-C stops the deployment, and the
# Redis too when this script started it (it keeps nothing worth keeping: tickets of a stopped fleet).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
config="${1:-deploy/local.yaml}"
[ $# -gt 0 ] && shift
# a config error is one line here and a non-zero exit, not a retried traceback while `serve run` waits on
if grep -q 'gateway.app:build_app' "$config"; then
  fleetgate check "$config" || exit 2
fi
source "$(dirname "${BASH_SOURCE[0]}")/local-redis.sh"
# Ray Serve's direct ingress: the gateway replica also serves HTTP on its own port (30000, and up for more
# replicas), past the Serve proxy, about 10 ms sooner to a first token here (docs/operations.md). :8000 stays.
# Ray reads it where the cluster starts, so it applies when `serve run` starts Ray itself (not RAY_ADDRESS).
export RAY_SERVE_ENABLE_DIRECT_INGRESS="${RAY_SERVE_ENABLE_DIRECT_INGRESS:-1}"
# The header guard in front of Ray Serve's own HTTP handling (gateway/http_guard.py: 431 over 64 KB of
# headers; a request id Ray cannot read is replaced). Also read where the cluster starts.
export RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH="${RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH:-gateway.http_guard.middlewares}"
if [ -z "${LOCAL_REDIS_PIDFILE:-}" ]; then
  exec serve run "$config" "$@"
fi
trap 'kill "$(cat "$LOCAL_REDIS_PIDFILE" 2>/dev/null)" 2>/dev/null && echo "[setup] stopped redis-server" >&2' EXIT
serve run "$config" "$@"
