"""Reading a Dockerfile and a .dockerignore the way ``docker build`` does, for the image tests.

Covers what ``docker/*.Dockerfile`` use: line continuations, comments, ``ARG`` defaults in
``FROM``, ``COPY [--flag=value]... SRC... DEST`` in shell or JSON form, exec-form
``ENTRYPOINT``/``CMD``. Not emulated: variable expansion outside ``FROM``, heredocs, ``ADD``
URLs, ``ONBUILD``; a Dockerfile using them fails ``parse`` loudly rather than passing.
.dockerignore patterns follow Docker's matcher: ``*`` and ``?`` within one path segment,
``**`` across segments, ``!`` re-includes, the last matching pattern wins, and a pattern
that matches a directory excludes everything below it.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

SUPPORTED = {"FROM", "ARG", "ENV", "RUN", "COPY", "WORKDIR", "USER", "EXPOSE", "ENTRYPOINT",
             "CMD", "LABEL"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Copy:
    """One ``COPY``: ``stage`` is its ``--from`` (None: from the build context)."""

    sources: tuple[str, ...]
    dest: str
    stage: str | None


@dataclass(slots=True)
class Stage:
    """One ``FROM`` and the instructions under it."""

    image: str
    """The base image with ``ARG`` defaults substituted."""
    name: str | None
    copies: list[Copy] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    """Each ``RUN``'s shell command, continuation lines joined."""
    user: str | None = None
    workdir: str = "/"
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None


def instructions(text: str) -> list[tuple[str, str]]:
    """``(KEYWORD, arguments)`` per instruction, continuation lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if pending and line.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction is dropped, as docker does
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        whole = pending + line
        pending = ""
        keyword, _, rest = whole.strip().partition(" ")
        out.append((keyword.upper(), rest.strip()))
    if pending:
        raise ValueError("the Dockerfile ends inside a continued line")
    return out


def _exec_form(keyword: str, args: str) -> list[str]:
    try:
        value = json.loads(args)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{keyword} must be in exec form (a JSON list), not {args!r}")
    return value


def parse(text: str) -> list[Stage]:
    """The stages of a Dockerfile, in order; ``ValueError`` for an instruction outside
    ``SUPPORTED`` or a shell-form ENTRYPOINT/CMD (PID 1 would be a shell that does not
    pass SIGTERM on to the process, so it would never drain)."""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for keyword, rest in instructions(text):
        if keyword not in SUPPORTED:
            raise ValueError(f"instruction {keyword} is not understood by this reader")
        if keyword == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name] = default.strip('"')
        elif keyword == "FROM":
            image, _, name = rest.partition(" AS ")
            for arg, value in args.items():
                image = image.replace("${" + arg + "}", value).replace("$" + arg, value)
            stages.append(Stage(image=image.strip(), name=name.strip() or None))
        elif not stages:
            raise ValueError(f"{keyword} before the first FROM")
        elif keyword == "COPY":
            stages[-1].copies.append(_copy(rest))
        elif keyword == "RUN":
            stages[-1].runs.append(rest)
        elif keyword == "USER":
            stages[-1].user = rest
        elif keyword == "WORKDIR":
            stages[-1].workdir = rest
        elif keyword == "ENTRYPOINT":
            stages[-1].entrypoint = _exec_form(keyword, rest)
        elif keyword == "CMD":
            stages[-1].cmd = _exec_form(keyword, rest)
    return stages


def _copy(rest: str) -> Copy:
    stage = None
    while rest.startswith("--"):
        flag, _, rest = rest.partition(" ")
        name, _, value = flag[2:].partition("=")
        if name == "from":
            stage = value
        rest = rest.lstrip()
    words = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
    if len(words) < 2:
        raise ValueError(f"COPY needs a source and a destination: {rest!r}")
    return Copy(sources=tuple(words[:-1]), dest=words[-1], stage=stage)


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def ignore_patterns(text: str) -> list[tuple[bool, re.Pattern[str]]]:
    """``(re-include, pattern)`` per line of a .dockerignore, in order."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        cleaned = line.lstrip("!").strip().strip("/")
        cleaned = cleaned[2:] if cleaned.startswith("./") else cleaned
        out.append((negate, _pattern_regex(cleaned)))
    return out


def ignored(path: str, patterns: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether the build context leaves out ``path`` (relative, ``/``-separated)."""
    parts = Path(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    verdict = False
    for negate, regex in patterns:
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            verdict = not negate
    return verdict
