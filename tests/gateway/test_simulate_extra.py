"""`firepool simulate` needs the `simulate` extra (numpy); without it the CLI says so."""

from __future__ import annotations

import sys

import pytest

from gateway.cli import main


def test_simulate_without_numpy_names_the_extra_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in [m for m in sys.modules if m == "simulator" or m.startswith("simulator.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "numpy", None)  # import numpy -> ModuleNotFoundError
    assert main(["simulate", "--help"]) == 2
    err = capsys.readouterr().err
    assert "numpy" in err
    assert "pip install 'firepool[simulate]'" in err
