#!/usr/bin/env bash
# Set up (if needed) and run the test suite: unit, integration (real Ray Serve, real vLLM on the CPU) and
# end-to-end (the `serve run` deployment through HTTP). Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
exec python -m pytest "$@"
