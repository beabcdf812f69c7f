"""Deploys are reproducible: ``firepool.toml`` in the function directory gives the settings
(flags override it), ``.firepoolignore`` leaves files out of the package, and a second
deploy of an unchanged directory sends no package bytes and says so."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from functions.deploy_config import load_deploy_config
from functions.errors import InvalidRequest, UnknownField
from functions.packaging import package_digest
from gateway.auth import Role
from gateway.cli import main
from tests.helpers import ThreadedBroker, threaded_broker

CATALOG = (
    "budgets: {cpu: 16}\n"
    "pools:\n"
    "  small: {units_per_pod: 1, max_count: 2}\n"
    "  wide: {units_per_pod: 4, max_count: 2}\n"
)
TOML = """\
name = "greet"
entrypoint = "greet:greet"
timeout = 60
retries = 1

[resources]
cpu = 3

[env]
GREETING = "hello"
"""
CODE = "def greet(who):\n    return f'hi {who}'\n"


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[ThreadedBroker]:
    with threaded_broker(tmp_path / "home", CATALOG, backend="fake") as server:
        yield server


@pytest.fixture
def function_dir(tmp_path: Path) -> Path:
    root = tmp_path / "greet"
    root.mkdir()
    (root / "greet.py").write_text(CODE)
    (root / "firepool.toml").write_text(TOML)
    (root / ".firepoolignore").write_text("data/\n*.log\n!keep.log\n")
    return root


def _puts(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("PUT ")]


def test_a_second_deploy_of_an_unchanged_directory_uploads_nothing_and_says_so(
    gateway: ThreadedBroker,
    function_dir: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="firepool.access")
    argv = ["deploy", str(function_dir), "--url", gateway.url,
            "--token", gateway.token("deployer", Role.DEPLOY)]  # fmt: skip
    assert main(argv) == 0
    first = capsys.readouterr().err
    assert len(_puts(caplog)) == 1, "the package went up once"
    (function_dir / "run.log").write_text("ignored by .firepoolignore")
    (function_dir / "data").mkdir()
    (function_dir / "data" / "big.bin").write_bytes(b"\0" * 100_000)
    caplog.clear()
    assert main(argv) == 0
    second = capsys.readouterr().err
    assert "uploaded nothing (0 bytes)" in second, second
    assert _puts(caplog) == [], "no package bytes sent"
    assert "uploaded nothing" not in first and "uploaded " in first, first


def test_firepool_toml_gives_the_settings_and_flags_override_them(
    gateway: ThreadedBroker, function_dir: Path
) -> None:
    with gateway.client("deployer", Role.DEPLOY) as fp:
        from_file = fp.deploy(function_dir)
        overridden = fp.deploy(function_dir, timeout_s=7, sku="small", env={"EXTRA": "1"})
    assert from_file["name"] == "greet" and from_file["sku"] == "wide", "cpu 3 rounds up"
    assert (from_file["timeout_s"], from_file["max_retries"]) == (60, 1)
    assert from_file["env"] == {"GREETING": "hello"}
    assert (overridden["timeout_s"], overridden["sku"]) == (7, "small")
    assert overridden["env"] == {"GREETING": "hello", "EXTRA": "1"}
    with gateway.client("caller") as fp:
        assert fp.function("greet").invoke("bob") == "hi bob"


def test_firepoolignore_and_the_deploy_files_stay_out_of_the_package(function_dir: Path) -> None:
    digest, _ = package_digest(function_dir)
    (function_dir / "keep.log").write_text("negated: packaged")
    kept, _ = package_digest(function_dir)
    (function_dir / "firepool.toml").write_text(TOML.replace("60", "90"))
    (function_dir / "x.log").write_text("ignored")
    assert kept != digest
    assert package_digest(function_dir)[0] == kept, "deploy settings and ignored files: same code"


def test_a_bad_firepool_toml_is_refused_naming_the_key(tmp_path: Path) -> None:
    (tmp_path / "firepool.toml").write_text('name = "x"\ntimout = 3\n')
    with pytest.raises(UnknownField, match="timout") as unknown:
        load_deploy_config(tmp_path)
    assert unknown.value.field == "timout"
    (tmp_path / "firepool.toml").write_text("retries = 'two'\n")
    with pytest.raises(InvalidRequest, match="retries must be int"):
        load_deploy_config(tmp_path)
    (tmp_path / "firepool.toml").write_text("[resources]\ncores = 2\n")
    with pytest.raises(UnknownField, match=r"unknown key 'resources\.cores'"):
        load_deploy_config(tmp_path)
    (tmp_path / "firepool.toml").write_text("name = \n")
    with pytest.raises(InvalidRequest, match="not valid TOML"):
        load_deploy_config(tmp_path)
