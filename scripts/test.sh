#!/usr/bin/env bash
# Install everything (into ./.venv) and run the whole test suite: lint, types, unit,
# writer contract/fault/crash tests (moto's S3 server and SeaweedFS are started by the tests on
# 127.0.0.1), and the real-runtime interop suite, which may not be skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
# System tools the tests use: mkfs.xfs (xfsprogs) and filefrag (e2fsprogs) for the
# copy-on-write tests on a loop-mounted XFS; headless Chromium and its driver (chromium,
# chromium-driver) for the browser tests of the HTML pages (tests/viz). As root (CI) they
# are installed and those tests are required; as another user they are skipped when missing.
export PATH="$PATH:/usr/sbin:/sbin"
if [ "$(id -u)" = 0 ]; then
    missing=()
    command -v mkfs.xfs >/dev/null 2>&1 || missing+=(xfsprogs)
    command -v filefrag >/dev/null 2>&1 || missing+=(e2fsprogs)
    [ -x /usr/bin/chromium ] || missing+=(chromium)
    [ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "== apt-get install ${missing[*]}"
        apt-get -o DPkg::Lock::Timeout=600 update -qq
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
            "${missing[@]}" >/dev/null
    fi
    export PTESTORE_REQUIRE_REFLINK=1
    export PTESTORE_REQUIRE_BROWSER=1
fi
# The test environment is installed from a lock (requirements/test.txt, made by
# `bash scripts/lock.sh` with uv's resolver): pip's resolver spends 20+ minutes
# backtracking over boto3/botocore/aiobotocore and executorch's requirements, and an
# unpinned install lets the next release of any of them turn CI red. uv installs the
# lock in seconds. The lock pins the CPU build of torch (torch==2.13.0+cpu), which comes
# from the machine's local wheels (PIP_FIND_LINKS); CUDA builds never match it.
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check "uv==0.13.9"
find_links=()
for d in ${PIP_FIND_LINKS:-/opt/wheels}; do [ -d "$d" ] && find_links+=(--find-links "$d"); done
uv_install() {
    .venv/bin/uv pip install --quiet --python .venv/bin/python \
        --index-strategy unsafe-best-match "${find_links[@]}" "$@"
}
echo "== install the locked test environment (requirements/test.txt)"
uv_install -r requirements/test.txt
uv_install --no-deps -e .

echo "== CPU-only torch, no nvidia-* packages"
.venv/bin/python scripts/check_cpu_only.py

echo "== ruff"
.venv/bin/ruff check ptestore tests scripts benchmarks examples
.venv/bin/ruff format --check ptestore tests scripts benchmarks examples
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
