"""``firepool.toml``: a function directory's deploy settings, so a deploy is reproducible.

    name = "verify"
    entrypoint = "verifier:verify"      # or: command = ["python", "main.py"]
    pool = "cpu"                        # or a [resources] table instead
    requirements = "requirements.txt"   # relative to the directory
    timeout = 60                        # seconds per attempt
    retries = 2
    pods = 1
    single_use = false

    [resources]                         # the smallest pool that fits is chosen
    cpu = 2
    memory = 4096                       # MiB
    gpus = 0
    accelerator = "h200"

    [env]
    LOG_LEVEL = "info"

Every key is optional; a deploy's flags (or ``Client.deploy``'s arguments) override the
file's, and an unknown key is refused by name. Pure: reads one file, sends nothing.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from functions.errors import InvalidRequest, UnknownField

CONFIG_FILE = "firepool.toml"
KEYS: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "entrypoint": (str,),
    "command": (list,),
    "pool": (str,),
    "resources": (dict,),
    "requirements": (str,),
    "env": (dict,),
    "timeout": (int, float),
    "retries": (int,),
    "pods": (int,),
    "single_use": (bool,),
}
"""Each key of ``firepool.toml`` and the TOML types it takes."""
RESOURCE_KEYS: dict[str, tuple[type, ...]] = {
    "cpu": (int, float),
    "memory": (int,),
    "gpus": (int,),
    "accelerator": (str,),
}


@dataclass(frozen=True, slots=True)
class DeployConfig:
    """A deploy's settings; None: not given (the gateway's default applies)."""

    name: str | None = None
    entrypoint: str | None = None
    command: list[str] | None = None
    pool: str | None = None
    resources: dict[str, Any] | None = None
    requirements: str | None = None
    """A path: relative to the directory in the file, as given in an override."""
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float | None = None
    max_retries: int | None = None
    pods: int | None = None
    single_use: bool | None = None

    def override(self, **given: Any) -> DeployConfig:
        """These settings with every argument that is not None in place of the file's
        (``env`` is merged, a given variable winning); ``entrypoint`` or ``command`` given
        replaces both of the file's, and so does ``pool`` or ``resources``."""
        given = {k: v for k, v in given.items() if v is not None and v != {}}
        if "entrypoint" in given or "command" in given:
            given = {"entrypoint": None, "command": None, **given}
        if "pool" in given or "resources" in given:
            given = {"pool": None, "resources": None, **given}
        if "requirements" in given:
            given["requirements"] = str(given["requirements"])
        if "env" in given:
            given["env"] = {**self.env, **given["env"]}
        return dataclasses.replace(self, **given)

    def registration(self) -> dict[str, Any]:
        """The body of ``POST /v1/functions`` less the package and requirements digests;
        ``InvalidRequest`` if it has no name or neither a pool nor resources."""
        if self.name is None:
            raise InvalidRequest(f"no function name: give --name or name in {CONFIG_FILE}",
                                 field="name")  # fmt: skip
        if self.pool is None and self.resources is None:
            raise InvalidRequest(
                f"no pool: give --sku (or --cpu/--gpus...), or pool or [resources] in "
                f"{CONFIG_FILE}",
                field="sku",
            )
        body: dict[str, Any] = {"name": self.name}
        for key, value in (
            ("sku", self.pool),
            ("resources", self.resources),
            ("entrypoint", self.entrypoint),
            ("command", self.command),
            ("timeout_s", self.timeout_s),
            ("max_retries", self.max_retries),
            ("pods", self.pods),
            ("single_use", self.single_use),
        ):
            if value is not None:
                body[key] = value
        if self.env:
            body["env"] = self.env
        return body


def load_deploy_config(directory: Path) -> DeployConfig:
    """``directory/firepool.toml``'s settings (none without the file). ``InvalidRequest``
    for a file that is not TOML or a value of the wrong type, ``UnknownField`` for a key it
    does not know, each naming the file and the key."""
    path = directory / CONFIG_FILE
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return DeployConfig()
    except tomllib.TOMLDecodeError as exc:
        raise InvalidRequest(f"{path}: not valid TOML: {exc}") from None
    _check(path, data, KEYS, "")
    resources = data.get("resources")
    if resources is not None:
        _check(path, resources, RESOURCE_KEYS, "resources.")
    command = data.get("command")
    if command is not None and not all(isinstance(a, str) for a in command):
        raise InvalidRequest(f"{path}: command is a list of strings", field="command")
    env = data.get("env") or {}
    for key, value in env.items():
        if not isinstance(value, str):
            raise InvalidRequest(f"{path}: env.{key} must be a string", field="env")
    requirements = data.get("requirements")
    return DeployConfig(
        name=data.get("name"),
        entrypoint=data.get("entrypoint"),
        command=command,
        pool=data.get("pool"),
        resources=resources,
        requirements=None if requirements is None else str(directory / requirements),
        env=dict(env),
        timeout_s=None if data.get("timeout") is None else float(data["timeout"]),
        max_retries=data.get("retries"),
        pods=data.get("pods"),
        single_use=data.get("single_use"),
    )


def _check(path: Path, data: dict[str, Any], keys: dict[str, tuple[type, ...]], at: str) -> None:
    for key, value in data.items():
        if key not in keys:
            raise UnknownField(
                f"{path}: unknown key {at + key!r} (known: {', '.join(keys)})", field=f"{at}{key}"
            )
        types = keys[key]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            names = " or ".join(t.__name__ for t in types)
            raise InvalidRequest(f"{path}: {at}{key} must be {names}", field=f"{at}{key}")
