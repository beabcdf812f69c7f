"""Venue models: the timing of one place pods run, read from a YAML data file.

A venue is everything the control plane does *not* decide: how long a pod takes from create
to ready (per phase, slowed when many start on one node at once), how long a deleted pod keeps
its GPU (or cores), what a dispatch, a hand-off and a reset cost, and the benchmark pool it
serves (cap, standbys per GPU, keep-alive). Every duration is a lognormal fitted to a median
and a p90 (``{median: m, p90: q}``; ``q == m`` is a constant), so the YAML holds the numbers
the paper reports (Table 1, C.4) rather than distribution parameters.

Pure data and sampling; the event loop owns the random streams.
"""

from __future__ import annotations

import math
import os
import random
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from functions.errors import InvalidRequest
from pool_manager.catalog import TAG_MODES, PoolSpec

VENUE_DIR = Path(__file__).resolve().parent / "venues"
_Z90 = 1.2815515655446004  # standard normal quantile at 0.9


@dataclass(frozen=True, slots=True)
class Dist:
    """A lognormal duration given by its median and p90 (seconds)."""

    median: float
    p90: float

    sigma: float = field(init=False, repr=False, compare=False)
    """The lognormal's shape, fixed at construction (0: a constant); sampling is hot."""

    def __post_init__(self) -> None:
        ok = self.p90 > self.median > 0
        object.__setattr__(self, "sigma", math.log(self.p90 / self.median) / _Z90 if ok else 0.0)

    def sample(self, rng: random.Random) -> float:
        s = self.sigma
        if s == 0.0:
            return self.median
        return self.median * math.exp(rng.gauss(0.0, s))


@dataclass(frozen=True, slots=True)
class Venue:
    """One venue: pod timings, control-plane costs and its benchmark pool."""

    name: str
    pool: PoolSpec
    budget: int
    """Units (GPUs or pods' cores) the pool's accelerator may hold: the cap of B.1."""
    start_phases: Mapping[str, Dist]
    """Create -> ready, phase by phase (summed); Table 1 for H200."""
    start_contention: float = 0.0
    """Each other pod starting on the node when this one is created, those created in the
    same scheduler pass included, stretches this start by this fraction (Table 1: 8 at once
    47.5 s against 19.8 s for one, so every pod of a burst of 8 is stretched 2.4×)."""
    tenant_wait: Dist = Dist(0.0, 0.0)
    """Extra create -> ready wait for node capacity beside other tenants' load (added once per
    pod, not stretched by contention); 0 on a dedicated node."""
    termination: Dist = Dist(1.0, 1.0)
    """Delete issued -> pod gone and its GPU (cores) free for a new pod."""
    accept_s: float = 0.04
    """Submit -> the dispatcher is woken (event-driven mode)."""
    dispatch_s: float = 0.01
    """Claim + durable commit of one job."""
    handoff: Dist = Dist(0.39, 0.5)
    """Commit -> the agent has the attempt (package, env)."""
    first_instruction: Dist = Dist(0.12, 0.15)
    """Agent accepted -> the job's first instruction."""
    job_overhead: Dist = Dist(0.0, 0.0)
    """In-job time around the fixed body (interpreter and framework start-up and teardown,
    result upload): the pod stays busy and the caller waits."""
    reset_s: float = 0.01
    """Job ended -> verified reset done, pod released."""
    promotion: Dist = Dist(0.0, 0.0)
    """Claim of a standby -> the per-GPU gate has promoted it and the job is handed off (0:
    instant, the shipped default; Table 6 reports 0.81 s of queue wait for promotions)."""
    dispatch_mode: str = "event"
    """``event``: passes on submit/release/ready; ``tick``: only every ``tick_s``."""
    tick_s: float = 3.0
    reconcile_s: float = 5.0
    gpus_per_node: int = 8
    notes: Mapping[str, str] = field(default_factory=dict)
    """Where each constant came from (calibrated on which figure, measured, or assumed)."""

    def __post_init__(self) -> None:
        """Raises ``ValueError`` for a venue the loop cannot run: a zero tick or reconcile
        interval (virtual time would stand still), no budget, or a GPU pool whose budget the
        node's cards cannot hold (one active pod per card)."""
        for key in ("tick_s", "reconcile_s"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"venue {self.name}: {key} must be positive, not {value:g}")
        if self.budget < 1:
            raise ValueError(f"venue {self.name}: budget must be at least 1, not {self.budget}")
        if self.pool.is_gpu and self.gpus_per_node < self.budget:
            raise ValueError(
                f"venue {self.name}: gpus_per_node ({self.gpus_per_node}) must hold the "
                f"budget's {self.budget} GPUs"
            )

    @property
    def sku(self) -> str:
        return self.pool.sku

    @property
    def is_gpu(self) -> bool:
        return self.pool.is_gpu

    def start_time(self, rng: random.Random, concurrent: int) -> float:
        """One pod's create -> ready with ``concurrent`` pods (itself and the others created
        in its pass included) starting."""
        base = sum(d.sample(rng) for d in self.start_phases.values())
        stretch = 1.0 + self.start_contention * max(0, concurrent - 1)
        return base * stretch + self.tenant_wait.sample(rng)

    def with_pool(self, **knobs: Any) -> Venue:
        return replace(self, pool=replace(self.pool, **knobs))

    def with_(self, **fields: Any) -> Venue:
        return replace(self, **fields)


_POOL_KEYS = {f for f in PoolSpec.__dataclass_fields__}
_TOP = {
    "name", "pool", "budget", "start_phases", "start_contention", "termination", "accept_s",
    "tenant_wait", "job_overhead", "promotion",
    "dispatch_s", "handoff", "first_instruction", "reset_s", "dispatch_mode", "tick_s",
    "reconcile_s", "gpus_per_node", "notes",
}  # fmt: skip


def venue_from_mapping(data: Mapping[str, Any]) -> Venue:
    """A ``Venue`` from a venue file's parsed YAML. Raises ``ValueError`` naming the first
    missing or unknown key and the first value of the wrong type or out of range (the same
    checks as ``--set``; the pool's knobs are checked by ``PoolSpec``, as the broker's)."""
    if not isinstance(data, Mapping):
        raise ValueError(f"a venue is a mapping of keys, not {type(data).__name__}")
    unknown = set(data) - _TOP
    if unknown:
        raise ValueError(f"unknown venue key {sorted(unknown, key=str)[0]!r}")
    missing = [key for key in ("name", "pool", "budget", "start_phases") if key not in data]
    if missing:
        raise ValueError(f"missing venue key {missing[0]!r}")
    pool_raw = _mapping("pool", data["pool"])
    bad = set(pool_raw) - _POOL_KEYS
    if bad:
        raise ValueError(f"unknown pool key {sorted(bad, key=str)[0]!r}")
    if "sku" not in pool_raw:
        raise ValueError("missing pool key 'sku'")
    try:
        pool = PoolSpec(**pool_raw)
    except InvalidRequest as exc:  # the broker's own check of each knob
        raise ValueError(str(exc)) from None
    kw: dict[str, Any] = {"name": str(data["name"]), "pool": pool}
    phases = _mapping("start_phases", data["start_phases"])
    kw["start_phases"] = {str(k): _yaml_dist(f"start_phases.{k}", v) for k, v in phases.items()}
    for key in _DIST_KEYS:
        if key in data:
            kw[key] = _yaml_dist(key, data[key])
    for key in _FLOAT_KEYS:
        if key in data:
            kw[key] = _number(key, data[key], float)
    for key in _INT_KEYS:
        if key in data:
            kw[key] = int(_number(key, data[key], int))
    if "dispatch_mode" in data:
        if data["dispatch_mode"] not in ("event", "tick"):
            raise ValueError(f"dispatch_mode: 'event' or 'tick', not {data['dispatch_mode']!r}")
        kw["dispatch_mode"] = str(data["dispatch_mode"])
    notes = _mapping("notes", data.get("notes") or {})
    kw["notes"] = {str(k): str(v) for k, v in notes.items()}
    return Venue(**kw)


def _mapping(key: str, raw: object) -> Mapping[Any, Any]:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{key}: a mapping of keys, not {raw!r}")
    return raw


def _yaml_dist(key: str, raw: object) -> Dist:
    """A duration as a venue file writes it: a number (a constant) or ``{median, p90}``."""
    if not isinstance(raw, Mapping):
        m = _number(key, raw, float)
        return Dist(m, m)
    extra = set(raw) - {"median", "p90"}
    if extra or "median" not in raw:
        raise ValueError(f"{key}: a number or {{median, p90}}, not {dict(raw)!r}")
    m = _number(key, raw["median"], float)
    return _checked_dist(key, m, _number(key, raw["p90"], float) if "p90" in raw else m)


def venue_names() -> list[str]:
    return sorted(p.stem for p in VENUE_DIR.glob("*.yaml"))


def load_venue(name_or_path: str) -> Venue:
    """A shipped venue by name (``h200``, ``prod-cpu``, ``local``) or a YAML file path
    (one with a suffix or a ``/``). Raises ``ValueError`` for an unknown name, and as
    ``load_venue_file`` for a file."""
    path = Path(name_or_path)
    if not path.suffix and "/" not in name_or_path:
        path = VENUE_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            shipped = ", ".join(venue_names())
            raise ValueError(f"unknown venue {name_or_path!r}; shipped: {shipped} or a YAML file")
    return load_venue_file(path)


def load_venue_file(path: Path) -> Venue:
    """The venue in ``path``. Raises ``ValueError`` naming the file and, for a bad venue,
    the key: a path that is not a readable file, YAML that does not parse, a missing,
    unknown or out-of-range key."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ValueError(f"venue file {str(path)!r}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or exc
        raise ValueError(f"venue file {str(path)!r} is not valid YAML{where}: {problem}") from None
    try:
        return venue_from_mapping(data)
    except ValueError as exc:
        raise ValueError(f"venue file {str(path)!r}: {exc}") from None


def check_venue_target(path: Path, new_ok: bool = True) -> None:
    """Before a measurement that rewrites ``path``: an existing file must be a valid venue
    (its other constants are kept) and writable; a new one (only if ``new_ok``) needs a
    writable folder. Raises ``ValueError`` naming the file, so a bad target fails before
    minutes of measuring, not after."""
    if path.exists():
        load_venue_file(path)
        if not os.access(path, os.W_OK):
            raise ValueError(f"venue file {str(path)!r}: not writable")
        return
    if not new_ok:
        raise ValueError(f"venue file {str(path)!r}: No such file or directory")
    folder = path.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        raise ValueError(f"venue file {str(path)!r}: no writable folder {str(folder)!r}")


def save_venue(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` (a venue file's mapping) to ``path`` as YAML, keys in order. Checked
    first (``ValueError`` naming the key), then written to a temporary file in the same
    folder and renamed over ``path``: a crash leaves the old file whole, never half."""
    venue_from_mapping(data)
    text = yaml.safe_dump(dict(data), sort_keys=False)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


_DIST_KEYS = (
    "termination", "handoff", "first_instruction", "tenant_wait", "job_overhead", "promotion",
)  # fmt: skip
_FLOAT_KEYS = ("start_contention", "accept_s", "dispatch_s", "reset_s", "tick_s", "reconcile_s")
_INT_KEYS = ("budget", "gpus_per_node")
_POOL_SETTINGS = ("min_count", "max_idle_count", "max_count", "idle_timeout_s", "caller_hold_s",
                  "step", "tag_mode", "standbys_per_active", "hold_min_tenure_s")  # fmt: skip


def _number(key: str, raw: object, kind: type[int] | type[float]) -> float:
    """``raw`` (a ``--set`` text or a venue file's value) as a finite ``kind`` >= 0; else
    ``ValueError`` naming ``key``. A YAML ``true`` or a fractional integer is refused, not
    read as 1 or truncated."""
    value: float | None = None
    if isinstance(raw, str | int | float) and not isinstance(raw, bool):
        try:
            value = kind(raw)
        except (ValueError, OverflowError):  # int("2.5"), int(inf)
            value = None
        if kind is int and isinstance(raw, float) and not raw.is_integer():
            value = None
    if value is None:
        what = "an integer" if kind is int else "a number"
        raise ValueError(f"{key}: {raw!r} is not {what}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{key}: {raw!r} must be a finite number >= 0")
    return value


def _checked_dist(key: str, median: float, p90: float) -> Dist:
    if p90 < median:
        raise ValueError(f"{key}: p90 {p90:g} is below the median {median:g}")
    return Dist(median, p90)


def _dist(key: str, text: str) -> Dist:
    median, _, p90 = text.partition("/")
    m = _number(key, median, float)
    return _checked_dist(key, m, _number(key, p90, float) if p90 else m)


def with_settings(venue: Venue, settings: Sequence[str]) -> Venue:
    """``venue`` with ``KEY=VALUE`` overrides, for sensitivity runs (``firepool simulate
    --set``). Durations take ``MEDIAN`` or ``MEDIAN/P90``; ``start_phases.NAME`` one start
    phase; ``pool.FIELD`` a scaling knob (``pool.idle_timeout_s=60``,
    ``pool.caller_hold_s=none``). Unknown keys and bad
    values raise ``ValueError`` naming the key."""
    for item in settings:
        key, sep, text = item.partition("=")
        key, text = key.strip(), text.strip()
        if not sep or not key or not text:
            raise ValueError(f"--set takes KEY=VALUE, not {item!r}")
        label = f"--set {key}"
        if key in _DIST_KEYS:
            venue = venue.with_(**{key: _dist(label, text)})
        elif key in _FLOAT_KEYS:
            venue = venue.with_(**{key: _number(label, text, float)})
        elif key in _INT_KEYS:
            venue = venue.with_(**{key: int(_number(label, text, int))})
        elif key == "dispatch_mode":
            if text not in ("event", "tick"):
                raise ValueError("--set dispatch_mode: 'event' or 'tick'")
            venue = replace(venue, dispatch_mode=text)
        elif key.startswith("start_phases."):
            phase = key.removeprefix("start_phases.")
            if phase not in venue.start_phases:
                known = ", ".join(venue.start_phases)
                raise ValueError(
                    f"--set {key}: {venue.name} has no start phase {phase!r} ({known})"
                )
            venue = replace(venue, start_phases={**venue.start_phases, phase: _dist(label, text)})
        elif key.startswith("pool.") and key.removeprefix("pool.") in _POOL_SETTINGS:
            venue = venue.with_pool(**{key.removeprefix("pool."): _pool_value(venue, key, text)})
        else:
            keys = [*_DIST_KEYS, *_FLOAT_KEYS, *_INT_KEYS, "dispatch_mode", "start_phases.NAME",
                    *(f"pool.{k}" for k in _POOL_SETTINGS)]  # fmt: skip
            raise ValueError(f"--set: unknown key {key!r}; known: {', '.join(keys)}")
    return venue


def _pool_value(venue: Venue, key: str, text: str) -> object:
    name = key.removeprefix("pool.")
    current = getattr(venue.pool, name)
    if name == "tag_mode":
        if text not in TAG_MODES:
            raise ValueError(f"--set {key}: one of {', '.join(TAG_MODES)}")
        return text
    if name == "caller_hold_s":
        return None if text == "none" else _number(f"--set {key}", text, float)
    seconds = name.endswith("_s")  # a YAML ``900`` keep-alive is still a duration
    kind = int if isinstance(current, int) and not seconds else float
    return _number(f"--set {key}", text, kind)
