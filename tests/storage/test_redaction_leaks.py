"""Where a URL's credentials leaked before (``ptestore._redact``, its users): the
``--debug`` traceback (an HTTP client's error in the chain names the URL it requested,
query included), every ptestore error's ``str()``, the library's ``verify()`` report,
``_log``'s records, the progress lines. Each against a presigned store on 127.0.0.1
(:mod:`support.presigned`) or a URL with a user and password."""

from __future__ import annotations

import io
import logging
from typing import Any

import pytest
from support.fixtures import get_fixture
from support.presigned import PASSWORD, SECRETS, presigned_store

import ptestore
from ptestore._log import get_logger
from ptestore.cli import main
from ptestore.cli.progress import Progress
from ptestore.coordinator.report import Event
from ptestore.errors import FormatError, MissingNamedData, StorageError

USER_URL = f"http://alice:{PASSWORD}@h/m.pte?X-Amz-Signature=SIGNATUREsecretA"


def _leaks(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


def test_the_debug_traceback_shows_no_credential(capsys: pytest.CaptureFixture[str]) -> None:
    with presigned_store({}) as store:
        code = main(["verify", store.url("/missing.pte"), "--debug"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" in err
    # the client's error (aiohttp's, the query in it) and fsspec's, both in the chain
    assert "ClientResponseError" in err and "X-Amz-Signature=REDACTED" in err
    assert _leaks(err) == []


def test_an_errors_str_shows_no_credential_its_args_keep_them() -> None:
    err = FormatError(USER_URL, "source.url", USER_URL, "a URL")
    assert _leaks(str(err)) == [] and "http://REDACTED@h/m.pte" in str(err)
    assert err.source == USER_URL and err.value == USER_URL  # the attributes as given
    wrapped = StorageError(f"{USER_URL}: failed: ClientResponseError(url='{USER_URL}')")
    assert _leaks(str(wrapped)) == [] and wrapped.args[0].count(PASSWORD) == 2
    missing = MissingNamedData(f"no key in {USER_URL}", key="k")
    assert _leaks(str(missing)) == []
    import pickle

    assert pickle.loads(pickle.dumps(missing)).args[0] == missing.args[0]


def test_a_log_record_shows_no_credential(caplog: pytest.LogCaptureFixture) -> None:
    log = get_logger("ptestore.test")
    with caplog.at_level(logging.WARNING, logger="ptestore.test"):
        log.warning("could not read %s: %s", USER_URL, OSError(f"GET {USER_URL} failed"))
        log.warning(f"in the message itself: {USER_URL}")
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert len(caplog.records) == 2 and _leaks(text) == []
    assert text.count("http://REDACTED@h/m.pte?X-Amz-Signature=REDACTED") == 3


def test_the_progress_lines_show_no_credential() -> None:
    stream = io.StringIO()
    progress = Progress(stream)
    progress(Event("fetch", url=USER_URL, nbytes=10, total=100))
    progress(Event("publish", url=USER_URL, seconds=0.5))
    progress.close()
    text = stream.getvalue()
    assert _leaks(text) == [] and "fetching m.pte" in text
    assert "published http://REDACTED@h/m.pte?X-Amz-Signature=REDACTED (0.50 s)" in text


def test_the_verify_report_shows_no_credential() -> None:
    data = get_fixture("mlp_portable").pte_path.read_bytes()  # type: ignore[union-attr]
    with presigned_store({"/m.pte": data}) as store:
        url = store.url("/m.pte")
        report = ptestore.verify(url)  # no record: invalid, its error quoting the URL
    assert report.status == "invalid" and report.url == url
    as_dict: dict[str, Any] = report.to_dict()
    assert _leaks(report.message()) == [] and _leaks(repr(as_dict)) == []
    assert as_dict["url"].startswith("http://REDACTED@127.0.0.1:")


def test_a_finding_quoting_a_long_url_is_redacted_before_it_is_cut() -> None:
    from ptestore.verification import VerifyReport, _stale

    token = "ghpTOKEN" * 50  # a user information longer than a cut string: its '@' cut off
    report = VerifyReport("/x.pte")
    _stale(report, "source.sha256", "made from {url}", url=f"https://{token}@h/m.pte")
    finding = report.findings[0]
    assert finding.message == "made from https://REDACTED@h/m.pte" and finding.text is None
    assert "ghpTOKEN" not in report.message()
