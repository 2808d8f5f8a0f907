#!/usr/bin/env bash
# Refresh the test environment's lock (requirements/test.txt) from pyproject.toml's extras:
#   bash scripts/lock.sh            (then review and commit requirements/test.txt)
# uv resolves in seconds what pip backtracks over for 20+ minutes; the CPU build of torch
# comes from the machine's local wheels (PIP_FIND_LINKS), hence unsafe-best-match.
set -euo pipefail
cd "$(dirname "$0")/.."
find_links=()
for d in ${PIP_FIND_LINKS:-/opt/wheels}; do [ -d "$d" ] && find_links+=(--find-links "$d"); done
uv pip compile pyproject.toml --extra s3 --extra interop --extra fleet --extra test \
    --python-version 3.11 --index-strategy unsafe-best-match "${find_links[@]}" \
    --custom-compile-command "bash scripts/lock.sh" -o requirements/test.txt "$@"
