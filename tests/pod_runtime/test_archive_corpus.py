"""Malicious packages (paper A.2): every one is rejected with a reason before anything runs,
and no byte lands outside the package directory."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import struct
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from functions.errors import PackageRejected
from pod_runtime.archive import ArchiveLimits, extract
from tests.pod_runtime.conftest import AgentProcess

MiB = 1024 * 1024


def _zip(entries: list[tuple[str | zipfile.ZipInfo, bytes]], **kw: int) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicates we want
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, data in entries:
                zf.writestr(name, data, **kw)
    return buf.getvalue()


def _info(name: str, mode: int) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.create_system = 3
    info.external_attr = mode << 16
    return info


def _mode(name: str, mode: int, data: bytes = b"x") -> bytes:
    return _zip([(_info(name, mode), data)])


def _overlapping() -> bytes:
    """Two central-directory entries whose local headers are the same bytes."""
    raw = _zip([("a.py", b"print('a')\n" * 100)])
    eocd = raw.rindex(b"PK\x05\x06")
    cd_size, cd_offset = struct.unpack("<LL", raw[eocd + 12 : eocd + 20])
    central = raw[cd_offset : cd_offset + cd_size]
    twin = central.replace(b"a.py", b"b.py")
    new_eocd = bytearray(raw[eocd:])
    struct.pack_into("<HHL", new_eocd, 8, 2, 2, cd_size * 2)
    return raw[:cd_offset] + central + twin + bytes(new_eocd)


def _overlapping_data() -> bytes:
    """Distinct local headers, but the first entry's data claims the second's bytes too."""
    raw = bytearray(_zip([("a.py", b"a" * 100), ("b.py", b"b" * 100)], compresslevel=0))
    at = raw.index(b"PK\x01\x02")
    size = struct.unpack_from("<L", raw, at + 20)[0]
    struct.pack_into("<L", raw, at + 20, size + 40)
    return bytes(raw)


def _nul_name() -> bytes:
    raw = _zip([("aXevil.py", b"x")])
    return raw.replace(b"aXevil.py", b"a\x00evil.py")


def _bad_utf8() -> bytes:
    info = zipfile.ZipInfo("caf\u00e9.py")
    raw = _zip([(info, b"x")])
    return raw.replace("caf\u00e9".encode(), b"caf\xff\xfe")


def _lying_size() -> bytes:
    raw = bytearray(_zip([("big.bin", b"A" * 4096)]))
    # Shrink the declared uncompressed size in both headers: the data inflates to more.
    for magic, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        at = raw.index(magic)
        struct.pack_into("<L", raw, at + offset, 16)
    return bytes(raw)


def _encrypted() -> bytes:
    raw = bytearray(_zip([("secret.py", b"x")]))
    for magic, offset in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        at = raw.index(magic)
        flags = struct.unpack_from("<H", raw, at + offset)[0]
        struct.pack_into("<H", raw, at + offset, flags | 1)
    return bytes(raw)


SMALL = ArchiveLimits(max_compressed=12 * MiB, max_written=8 * MiB, max_files=500)

CORPUS: dict[str, Callable[[], bytes]] = {
    "zip slip": lambda: _zip([("../evil.py", b"x")]),
    "deep zip slip": lambda: _zip([("a/b/../../../evil.py", b"x")]),
    "absolute path": lambda: _zip([("/tmp/firepool-evil.py", b"x")]),
    "backslash dot-dot": lambda: _zip([("..\\evil.py", b"x")]),
    "backslash in name": lambda: _zip([("a\\b.py", b"x")]),
    "symlink entry": lambda: _mode("link", stat.S_IFLNK | 0o777, b"/etc/passwd"),
    "symlink then write through it": lambda: _zip(
        [(_info("d", stat.S_IFLNK | 0o777), b"/tmp"), ("d/firepool-evil.py", b"x")]
    ),
    "character device": lambda: _mode("tty", stat.S_IFCHR | 0o666),
    "block device": lambda: _mode("sda", stat.S_IFBLK | 0o666),
    "fifo": lambda: _mode("pipe", stat.S_IFIFO | 0o666),
    "socket": lambda: _mode("sock", stat.S_IFSOCK | 0o666),
    "file claiming to be a directory": lambda: _mode("notadir", stat.S_IFDIR | 0o755),
    "duplicate names": lambda: _zip([("a.py", b"1"), ("a.py", b"2")]),
    "duplicate after normalisation": lambda: _zip([("a/./b.py", b"1"), ("a/b.py", b"2")]),
    "file and directory of one name": lambda: _zip([("a", b"1"), ("a/b.py", b"2")]),
    "zip bomb by ratio": lambda: _zip([("zeros.bin", b"\0" * (6 * MiB))]),
    "zip bomb by entry count": lambda: _zip([(f"f{i}", b"") for i in range(501)]),
    "declared total over the cap": lambda: _zip(
        [(f"r{i}.bin", os.urandom(1024) * 1024) for i in range(9)], compresslevel=0
    ),
    "overlapping entries": _overlapping,
    "data overlapping the next entry": _overlapping_data,
    "NUL in name": _nul_name,
    "control character in name": lambda: _zip([("a\nb.py", b"x")]),
    "invalid UTF-8 name": _bad_utf8,
    "empty name": lambda: _zip([("./", b"")]),
    "sizes that lie": _lying_size,
    "encrypted entry": _encrypted,
    "truncated archive": lambda: _zip([("a.py", b"x" * 1000)])[:-30],
    "not a zip": lambda: b"#!/bin/sh\necho pwned\n",
    "too large compressed": lambda: _zip([("r.bin", os.urandom(13 * MiB))], compresslevel=0),
    "path deeper than the cap": lambda: _zip([("a/" * 64 + "evil.py", b"x")]),
    "path deeper than the recursion limit": lambda: _zip([("a/" * 1500 + "evil.py", b"x")]),
    "name longer than the cap": lambda: _zip([("/".join(["d" * 250] * 16) + "/evil.py", b"x")]),
    "more implied directories than the cap": lambda: _zip(
        [(f"d{i}/" + "a/" * 59 + "evil.py", b"x") for i in range(10)]
    ),
    "zip bomb by many entries at the ratio threshold": lambda: _zip(
        [(f"z{i}", b"\0" * MiB) for i in range(7)]
    ),
}


def test_the_corpus_has_at_least_twenty_archives() -> None:
    assert len(CORPUS) >= 20


@pytest.mark.parametrize("case", sorted(CORPUS))
def test_a_malicious_package_is_rejected_and_writes_nothing_outside(
    case: str, tmp_path: Path
) -> None:
    data = CORPUS[case]()
    archive = tmp_path / "evil.zip"
    archive.write_bytes(data)
    dest = tmp_path / "root" / "workspace" / "pkg"
    dest.mkdir(parents=True)
    before = sorted(p for p in tmp_path.rglob("*") if not p.is_relative_to(dest))
    with pytest.raises(PackageRejected) as rejected:
        extract(archive, dest, SMALL)
    assert rejected.value.message
    assert list(dest.iterdir()) == []
    after = sorted(p for p in tmp_path.rglob("*") if not p.is_relative_to(dest))
    assert after == before
    assert not Path("/tmp/firepool-evil.py").exists()


def test_a_well_formed_package_extracts_with_exec_bits(tmp_path: Path) -> None:
    script = zipfile.ZipInfo("bin/run.sh")
    script.external_attr = (stat.S_IFREG | 0o755) << 16
    archive = tmp_path / "ok.zip"
    archive.write_bytes(_zip([("pkg/__init__.py", b""), ("main.py", b"x = 1\n"), (script, b"")]))
    dest = tmp_path / "pkg"
    assert extract(archive, dest, SMALL) == 3
    assert (dest / "main.py").read_text() == "x = 1\n"
    assert os.access(dest / "bin" / "run.sh", os.X_OK)
    assert not os.access(dest / "main.py", os.X_OK)


def test_the_agent_rejects_a_malicious_package_and_runs_nothing(
    agent_factory: Callable[..., AgentProcess],
) -> None:
    agent = agent_factory(name="corpus")
    marker = agent.pod_dir / "ran"
    main = f"def f(x):\n    open({str(marker)!r}, 'w').write('ran')\n".encode()
    archive = agent.pod_dir / "evil.zip"
    archive.write_bytes(_zip([("main.py", main), ("../escaped.py", b"x")]))
    pkg = {"url": archive.as_uri(), "digest": hashlib.sha256(archive.read_bytes()).hexdigest()}
    result = agent.run({"attempt_id": "evil-1:1", "package": pkg, "entrypoint": "main:f"})
    assert result["state"] == "failed"
    assert result["error"]["class"] == "PackageRejected"
    assert "escapes" in result["error"]["message"]
    assert result["exit_code"] is None and result["first_instruction"] is None
    assert not marker.exists()
    assert not (agent.pod_dir / "workspace" / "escaped.py").exists()
    assert list((agent.pod_dir / "workspace" / "pkg").iterdir()) == []
