"""``ptestore._log``: a run imports :mod:`logging` only when something else did (or to
say a warning), and loses no record a configured :mod:`logging` would show."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from ptestore._log import get_logger

PROBE = """\
import json, sys
from ptestore._log import get_logger
log = get_logger("ptestore.probe")
log.debug("d %s", 1)
log.info("i %s", 2)
before = "logging" in sys.modules
log.warning("w %s", 3)
print(json.dumps({"before": before, "after": "logging" in sys.modules}))
"""


def test_debug_and_info_import_nothing_and_a_warning_reaches_stderr() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(done.stdout) == {"before": False, "after": True}
    # unconfigured logging: the last-resort handler prints warnings only
    assert done.stderr == "w 3\n"


def test_records_reach_a_configured_logger_with_the_callers_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = get_logger("ptestore.test_lazy")
    with caplog.at_level(logging.DEBUG, logger="ptestore.test_lazy"):
        log.debug("debug %d", 1)
        log.info("info %s", "two")
        log.warning("warning")
        log.error("error")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("DEBUG", "debug 1"),
        ("INFO", "info two"),
        ("WARNING", "warning"),
        ("ERROR", "error"),
    ]
    assert {r.filename for r in caplog.records} == {"test_lazy_logging.py"}
    assert {r.funcName for r in caplog.records} == {
        "test_records_reach_a_configured_logger_with_the_callers_line"
    }


def test_levels_are_the_configured_ones(caplog: pytest.LogCaptureFixture) -> None:
    log = get_logger("ptestore.test_lazy_levels")
    with caplog.at_level(logging.WARNING, logger="ptestore.test_lazy_levels"):
        log.info("dropped")
        log.warning("kept")
    assert [r.getMessage() for r in caplog.records] == ["kept"]
    assert log.logger is logging.getLogger("ptestore.test_lazy_levels")
