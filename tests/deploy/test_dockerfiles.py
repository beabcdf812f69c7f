"""The images build from what the repository holds: each Dockerfile's COPY sources exist and
survive the .dockerignore, its entrypoint module imports from exactly the files it copies
(with this venv's third-party packages standing in for the image's), its base is pinned,
and it runs unprivileged. No docker daemon runs here, so nothing is built: these checks
read the Dockerfiles (``tests.deploy.dockerfile`` says what that reader covers)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path, PurePosixPath

import pytest

from tests.deploy.dockerfile import Stage, ignore_patterns, ignored, parse

ROOT = Path(__file__).resolve().parents[2]
IMAGES = {"broker": "gateway.cli", "pod": "pod_runtime.agent"}
"""Each image and the module its entrypoint runs."""
FIRST_PARTY = ("gateway", "broker", "functions", "pool_manager", "pod_runtime", "simulator")
PINNED_PYTHON = re.compile(r"^python:3\.\d+\.\d+-slim-[a-z]+(@sha256:[0-9a-f]{64})?$")
"""A base pinned to one Python patch release on one Debian release (a digest may follow)."""


def stages_of(image: str) -> list[Stage]:
    return parse((ROOT / "docker" / f"{image}.Dockerfile").read_text())


def context_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    return ignore_patterns((ROOT / ".dockerignore").read_text())


def missing_sources(stages: list[Stage], root: Path) -> list[str]:
    """Each COPY source from the build context that is not in ``root`` or that the
    .dockerignore leaves out of the context (either fails ``docker build``)."""
    patterns = context_patterns()
    return [
        source
        for stage in stages
        for copy in stage.copies
        if copy.stage is None
        for source in copy.sources
        if not (root / source).exists() or ignored(source, patterns)
    ]


def copied_tree(stages: list[Stage], into: Path) -> Path:
    """Lay out under ``into`` the files the build stage copies from the context (what the
    .dockerignore keeps of them) at their paths in the image; returns its WORKDIR there."""
    patterns = context_patterns()
    build = stages[0]
    workdir = PurePosixPath(build.workdir)
    for copy in build.copies:
        assert copy.stage is None
        dest = workdir / copy.dest
        for source in copy.sources:
            src = ROOT / source
            if src.is_dir():
                for file in src.rglob("*"):
                    relative = file.relative_to(ROOT).as_posix()
                    if file.is_file() and not ignored(relative, patterns):
                        target = into / dest.relative_to("/") / file.relative_to(src)
                        target.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(file, target)
            else:
                name = PurePosixPath(source).name
                target_path = dest / name if copy.dest.endswith("/") else dest
                target = into / target_path.relative_to("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, target)
    return into / workdir.relative_to("/")


IMPORT_CHECK = """
import importlib, os, sys
root, module, first_party = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
importlib.import_module(module)
outside = sorted(
    name for name, mod in list(sys.modules.items())
    if name.split(".")[0] in first_party and getattr(mod, "__file__", None)
    and not os.path.realpath(mod.__file__).startswith(os.path.realpath(root) + os.sep)
)
print(" ".join(outside))
sys.exit(1 if outside else 0)
"""


def imports_from(tree: Path, module: str) -> subprocess.CompletedProcess[str]:
    """Import ``module`` in a fresh interpreter whose first-party code comes from ``tree``
    first (the venv's editable install is searched after ``sys.path``); exits 1 naming any
    first-party module it still had to take from outside ``tree``."""
    return subprocess.run(
        [sys.executable, "-c", IMPORT_CHECK, str(tree), module, ",".join(FIRST_PARTY)],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_every_copy_source_exists_and_is_in_the_build_context(image: str) -> None:
    stages = stages_of(image)
    sources = [s for stage in stages for c in stage.copies if c.stage is None for s in c.sources]
    assert sources, "the image copies nothing from the repository"
    assert missing_sources(stages, ROOT) == []


def test_a_copy_of_a_missing_or_ignored_path_is_caught() -> None:
    stages = parse(
        "FROM python:3.11.11-slim-bookworm AS build\n"
        "COPY pyproject.toml no_such_dir ./\n"
        "COPY .venv/bin/python tests/conftest.py ./\n"
    )
    assert missing_sources(stages, ROOT) == ["no_such_dir", ".venv/bin/python",
                                             "tests/conftest.py"]  # fmt: skip


IMAGE_PACKAGES = {
    "broker": {"gateway", "broker", "pool_manager", "functions", "pod_runtime", "simulator"},
    "pod": {"pod_runtime", "functions"},
}
"""The first-party packages each image's wheel holds: a pod runs the agent and the error
classes it reports, never broker code."""
PIP_INSTALL_HERE = re.compile(r"/opt/firepool/bin/pip install (--no-deps )?\.(\s|$)")


def built_wheel(tree: Path, into: Path) -> Path:
    """Build the wheel ``pip install .`` builds in the image's WORKDIR ``tree``, offline
    (this venv's setuptools, no index), and unpack it under ``into``; returns that dir."""
    out = into / "wheel"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", str(out), str(tree)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    (wheel,) = out.glob("*.whl")
    unpacked = into / "installed"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(unpacked)
    return unpacked


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_the_image_installs_a_wheel_of_its_copied_files_whose_entrypoint_imports(
    image: str, tmp_path: Path
) -> None:
    stages = stages_of(image)
    final = stages[-1]
    command = [*(final.entrypoint or []), *(final.cmd or [])]
    assert command[:3] == ["python", "-m", IMAGES[image]]
    assert any(PIP_INSTALL_HERE.search(run) for run in stages[0].runs)
    installed = built_wheel(copied_tree(stages, tmp_path / "image"), tmp_path)
    packages = {p.name for p in installed.iterdir() if (p / "__init__.py").exists()}
    assert packages == IMAGE_PACKAGES[image]
    if image == "broker":  # the store's migrations travel as package data
        assert (installed / "broker" / "store" / "migrations" / "env.py").exists()
    result = imports_from(installed, IMAGES[image])
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_import_check_fails_when_a_package_the_module_needs_is_not_copied(
    tmp_path: Path,
) -> None:
    stages = parse(
        "FROM python:3.11.11-slim-bookworm AS build\nWORKDIR /src\n"
        "COPY pod_runtime ./pod_runtime\n"  # without functions/, which the agent imports
    )
    result = imports_from(copied_tree(stages, tmp_path), "pod_runtime.agent")
    assert result.returncode == 1
    assert "functions.errors" in result.stdout.split()


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_the_image_is_multi_stage_pinned_and_runs_unprivileged(image: str) -> None:
    stages = stages_of(image)
    assert len(stages) >= 2
    for stage in stages:
        assert PINNED_PYTHON.fullmatch(stage.image), stage.image
    final = stages[-1]
    assert [c.stage for c in final.copies] == ["build"], "the final stage takes the venv only"
    assert final.user is not None
    assert final.user.split(":")[0] not in ("root", "0")
    assert int(final.user.split(":")[0]) >= 1000


def test_the_pod_requirements_are_the_ranges_pyproject_declares() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    lines = (ROOT / "docker" / "pod-requirements.txt").read_text().splitlines()
    wanted = [line for line in lines if line and not line.startswith("#")]
    assert wanted
    for requirement in wanted:
        assert requirement in declared or requirement in dev["dev"], requirement


@pytest.mark.parametrize(
    "path",
    [".firepool/signing.key", ".venv/bin/python", ".git/config", "broker/__pycache__/x.pyc",
     "tests/conftest.py", "helm/firepool/values.yaml"],
)  # fmt: skip
def test_the_build_context_leaves_out_state_venvs_and_tests(path: str) -> None:
    assert ignored(path, context_patterns())


def test_a_reinclude_pattern_wins_when_it_comes_last() -> None:
    patterns = ignore_patterns("docs\n!docs/keep.md\n**/*.key\n")
    assert ignored("docs/other.md", patterns)
    assert not ignored("docs/keep.md", patterns)
    assert ignored("a/b/signing.key", patterns)
    assert not ignored("broker/keys.py", patterns)


def test_a_shell_form_entrypoint_is_refused() -> None:
    with pytest.raises(ValueError, match="exec form"):
        parse("FROM python:3.11.11-slim-bookworm\nENTRYPOINT python -m gateway.cli\n")
