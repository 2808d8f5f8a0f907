#!/usr/bin/env bash
# Install everything (into ./.venv) and run the whole test suite: lint, types, unit,
# writer contract/fault/crash tests (moto's S3 server and SeaweedFS are started by the tests on
# 127.0.0.1), and the real-runtime interop suite, which may not be skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
# torch==2.13.0 (CPU) and executorch==1.4.1 come with the [interop] extra.
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[s3,interop,test]'

echo "== ruff"
.venv/bin/ruff check ptestore tests scripts benchmarks examples
echo "== mypy"
.venv/bin/mypy
echo "== pytest"
export PTESTORE_REQUIRE_INTEROP=1
set +e
.venv/bin/python -m pytest "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests: failing" >&2
    exit 1
fi
exit "$status"
