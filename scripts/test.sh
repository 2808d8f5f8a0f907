#!/usr/bin/env bash
# Install everything (into ./.venv) and run the whole test suite: lint, types, unit,
# writer contract/fault/crash tests (moto's S3 server and SeaweedFS are started by the tests on
# 127.0.0.1), and the real-runtime interop suite, which may not be skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
# System tools the tests use: mkfs.xfs (xfsprogs) and filefrag (e2fsprogs) for the
# copy-on-write tests on a loop-mounted XFS. As root (CI) they are installed and those
# tests are required; as another user they are skipped when missing.
export PATH="$PATH:/usr/sbin:/sbin"
if [ "$(id -u)" = 0 ]; then
    missing=()
    command -v mkfs.xfs >/dev/null 2>&1 || missing+=(xfsprogs)
    command -v filefrag >/dev/null 2>&1 || missing+=(e2fsprogs)
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "== apt-get install ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            "${missing[@]}" >/dev/null
    fi
    export PTESTORE_REQUIRE_REFLINK=1
fi
# The [interop] extra's torch pin, e.g. torch==2.13.0 (pyproject.toml is its one home).
TORCH_PIN="$(grep -o '"torch==[^"]*"' pyproject.toml | tr -d '"')"
if [ -z "$TORCH_PIN" ]; then
    echo "scripts/test.sh: no \"torch==VERSION\" pin found in pyproject.toml" >&2
    exit 1
fi
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
pip_install() {
    .venv/bin/python -m pip install --quiet --disable-pip-version-check "$@"
}
# torch first, on its own: resolved together with the extras, torch==2.13.0 can pick the
# registry's CUDA build, which pulls ~4 GB of nvidia-* and triton wheels. Alone it takes
# the CPU build; the extras then find it installed and keep it.
pip_install "$TORCH_PIN"
# executorch==1.4.1 comes with the [interop] extra, moto and the pinned linters with [test].
pip_install -e '.[s3,interop,test]'

echo "== CPU-only torch, no nvidia-* packages"
.venv/bin/python scripts/check_cpu_only.py

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
