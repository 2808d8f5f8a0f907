"""``fetch`` into a ``DEST`` that holds the artifact's very bytes but is owned by another
user (a shared sticky directory): for another user not current (its owner could rewrite
it later), so the download-and-replace path it took before, which in a sticky directory
is refused (EPERM), never accepted as it is; for root current (root's replacement keeps
the owner, as the writers' take-over does: nothing to gain, republished at every run)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from support.as_user import NOBODY, ROOT_ONLY, as_user, reachable_dir
from support.fleet_backend import specialized_pair

import ptestore


@ROOT_ONLY
def test_a_dest_another_user_owns_is_not_current(tmp_path: Path) -> None:
    pte, ptd = specialized_pair(tmp_path, "a", 2.0)
    with reachable_dir("ptestore-owner-") as shared:
        os.chmod(shared, 0o1777)
        src = shared / "src"
        src.mkdir()
        for f in (pte, ptd):
            shutil.copyfile(f, src / f.name)
        dest = shared / "m.pte"
        ptestore.fetch(src / "m.pte", dest)
        assert ptestore.fetch(src / "m.pte", dest).current  # root's own: current
        for f in (dest, dest.with_suffix(".ptd")):
            os.chown(f, NOBODY, NOBODY)
            os.chmod(f, 0o644)
        ino = dest.stat().st_ino
        # as root: current (a replacement would keep the owner: nothing gained)
        result = ptestore.fetch(src / "m.pte", dest)
        assert result.current and [f["current"] for f in result.files] == [True, True]
        assert dest.stat().st_ino == ino and dest.stat().st_uid == NOBODY
        assert dest.read_bytes() == pte.read_bytes()
        # as another user in the sticky directory: not accepted; replacing it is refused
        other = NOBODY - 1

        def run() -> bool:
            return ptestore.fetch(str(src / "m.pte"), str(dest)).current

        got = as_user(other, run)
        assert not got.startswith("ok"), got
        assert dest.stat().st_uid == NOBODY and dest.read_bytes() == pte.read_bytes()
