"""What the agent hands a job's uid and takes back (``pod_runtime.jobuser``)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from pod_runtime import jobuser


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")
def test_what_is_taken_back_is_roots_and_only_root_may_write_it(tmp_path: Path) -> None:
    """An install running as the job's uid left its tree 0777 and its files 0666; chowned
    back to root they stayed writable to every later job of the pod (adversarial run)."""
    site = tmp_path / "site"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg" / "mod.py").write_text("x = 1\n")
    (site / "run.sh").write_text("#!/bin/sh\n")
    (site / "link").symlink_to("/etc/hostname")
    jobuser.hand_over_tree(site, jobuser.JOB_UID)
    for path in (site, site / "pkg"):
        path.chmod(0o777)
    (site / "pkg" / "mod.py").chmod(0o666)
    (site / "run.sh").chmod(0o775)
    jobuser.take_back(site)
    modes = {
        p.relative_to(tmp_path).as_posix(): (p.lstat().st_uid, stat.S_IMODE(p.lstat().st_mode))
        for p in (site, site / "pkg", site / "pkg" / "mod.py", site / "run.sh")
    }
    assert modes == {
        "site": (0, 0o755),
        "site/pkg": (0, 0o755),
        "site/pkg/mod.py": (0, 0o644),
        "site/run.sh": (0, 0o755),
    }
    assert (site / "link").lstat().st_uid == 0 and Path("/etc/hostname").stat().st_uid == 0
