"""The SKU catalog: one ``PoolSpec`` per hardware pool and one budget per accelerator.

Read once at startup (frozen dataclasses). A catalog file is YAML::

    budgets: {cpu: 16, h200: 2}          # units (CPU cores or GPUs) per accelerator
    limits: {max_pods: 64, max_gpus: 8}  # per-caller default (optional)
    caller_limits: {rl-trainer: {max_gpus: 16}}
    pools:
      cpu:   {accelerator: cpu, units_per_pod: 1, min_count: 1, max_count: 8}
      h200:  {accelerator: h200, units_per_pod: 1, standbys_per_active: 3}
      big:
        template:                          # the pod template (the kubernetes backend)
          image: registry.example/firepool-pod:1.0
          resources: {limits: {cpu: "4", memory: 16Gi}}

Unknown keys are rejected with the key's name, like every other input. A pool's ``template``
is either a version string (``v2``) or a pod template (``PodTemplate``), plain data here:
only a backend turns it into a pod.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from functions.errors import FirepoolError, InvalidRequest, UnknownField
from functions.resources import Resources

POOL_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
"""Pool (sku) and accelerator names: a function's ``sku`` takes the same form, and the name
becomes part of pod names, cgroup paths and metric labels (``zz/../../x`` would put a pool's
cgroups outside the broker's tree)."""
MODULE_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
"""A dotted module name, as ``preload`` takes them."""

TEMPLATE_KEYS = ("image", "command", "resources", "node_selector", "tolerations",
                 "runtime_class", "security_context", "service_account")  # fmt: skip
"""The keys of a pool's pod template (``PodTemplate``)."""


@dataclass(frozen=True, slots=True, eq=False)
class PodTemplate:
    """How a pool's pods are made on Kubernetes. Plain data, checked for shape here (types,
    unknown keys); the API server checks the values (a bad quantity fails the create).
    Compared and hashed by ``digest``."""

    image: str
    """The pod image: the agent, Python and the pool's preloads (docker/pod.Dockerfile)."""
    command: tuple[str, ...] = ()
    """The container's command, before the agent's options; empty:
    ``python -m pod_runtime.agent``."""
    resources: Mapping[str, Any] = field(default_factory=dict)
    """The container's ``resources`` (``requests``/``limits``), as in a pod spec."""
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    runtime_class: str | None = None
    """``runtimeClassName`` (gVisor, Kata: a sandbox the pod runs in)."""
    security_context: Mapping[str, Any] = field(default_factory=dict)
    """The container's ``securityContext``."""
    service_account: str | None = None
    """``serviceAccountName``; None: the namespace's default."""

    def to_json(self) -> dict[str, Any]:
        return {
            "image": self.image,
            "command": list(self.command),
            "resources": dict(self.resources),
            "node_selector": dict(self.node_selector),
            "tolerations": [dict(t) for t in self.tolerations],
            "runtime_class": self.runtime_class,
            "security_context": dict(self.security_context),
            "service_account": self.service_account,
        }

    @property
    def digest(self) -> str:
        """16 hex digits naming this template's content (canonical JSON, sha256)."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PodTemplate) and other.digest == self.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any], sku: str) -> PodTemplate:
        """``UnknownField``/``InvalidRequest`` naming ``template.<key>``."""
        bad = set(raw) - set(TEMPLATE_KEYS)
        if bad:
            name = sorted(bad)[0]
            raise UnknownField(f"unknown key {name!r} in pool {sku!r}'s template",
                               field=f"template.{name}")  # fmt: skip

        def wrong(key: str, what: str) -> InvalidRequest:
            return InvalidRequest(f"pool {sku!r}: template.{key} must be {what}, not "
                                  f"{raw[key]!r}", field=f"template.{key}")  # fmt: skip

        image = raw.get("image")
        if not isinstance(image, str) or not image.strip():
            raise InvalidRequest(f"pool {sku!r}: a template needs an image",
                                 field="template.image")  # fmt: skip
        command = raw.get("command") or []
        if not isinstance(command, list) or not all(isinstance(c, str) for c in command):
            raise wrong("command", "a list of strings")
        for key in ("resources", "security_context"):
            if raw.get(key) is not None and not isinstance(raw[key], Mapping):
                raise wrong(key, "a mapping")
        selector = raw.get("node_selector") or {}
        if not isinstance(selector, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in selector.items()
        ):
            raise wrong("node_selector", "a mapping of strings to strings")
        tolerations = raw.get("tolerations") or []
        if not isinstance(tolerations, list) or not all(
            isinstance(t, Mapping) for t in tolerations
        ):
            raise wrong("tolerations", "a list of mappings")
        for key in ("runtime_class", "service_account"):
            if raw.get(key) is not None and not (isinstance(raw[key], str) and raw[key]):
                raise wrong(key, "a non-empty string")
        return cls(
            image=image,
            command=tuple(command),
            resources=dict(raw.get("resources") or {}),
            node_selector=dict(selector),
            tolerations=tuple(dict(t) for t in tolerations),
            runtime_class=raw.get("runtime_class"),
            security_context=dict(raw.get("security_context") or {}),
            service_account=raw.get("service_account"),
        )


NETWORK_MODES: tuple[str, ...] = ("none", "outbound", "host")
"""A pool's ``network``: ``pod_runtime.network.NETWORK_MODES`` (which this may not import)."""
TagMode = Literal["retire", "switch", "hint"]
TAG_MODES: tuple[str, ...] = ("retire", "switch", "hint")


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """One hardware pool (SKU) and its scaling knobs (paper §7, App. A.5)."""

    sku: str
    """Pool name callers and functions refer to, e.g. ``cpu`` or ``h200-1g``."""
    accelerator: str = "cpu"
    """Budget ledger this pool draws from: ``cpu`` (cores) or a GPU model (GPUs)."""
    units_per_pod: int = 1
    """GPUs (or CPU cores for ``cpu``) one pod occupies."""
    min_count: int = 0
    """Floor: pods kept ready at zero demand."""
    max_idle_count: int = 2
    """Idle cap: unheld idle pods retained past their keep-alive (never pre-created), unless
    another pool's queued jobs on the same accelerator budget need their units (``scaler``'s
    budget reclaim)."""
    max_count: int = 8
    """Ceiling: hard cap on pods (GPU groups) the pool holds, starting and held included."""
    idle_timeout_s: float = 300.0
    """Keep-alive: an idle pod past this may be removed by scale-down."""
    caller_hold_s: float | None = None
    """Owner hold after release; ``None`` inherits ``idle_timeout_s``."""
    step: int = 4
    """Most pods created per scaler pass."""
    drain_budget: int = 1
    """Template rollout: the most groups of this pool retiring at once (deletes in flight,
    whatever their reason) for which another pod of an old template is retired. An
    old-template pod past the budget stays in service (held for its owner, or idle) until a
    retirement completes (docs/control_plane.md, "Template rollout")."""
    tag_mode: TagMode = "retire"
    """How a caller's lease tag (its session) bounds reuse:

    * ``retire``: a job of a new session may run once on one of the caller's pods held for
      another session (``recycled``), which then retires; the caller's other sessions keep
      their warm pods, so concurrent sessions of one caller do not evict each other;
    * ``switch``: one live session per caller and queue (paper §5: "when a caller switches
      to a new session ... the prior pod is retired"): a job of a new session also retires
      every pod the caller holds for its other tags on that queue, so a session's state
      reaches at most one job of the next. Strictest; concurrent sessions churn pods;
    * ``hint``: the tag only prefers the same pod; caller and queue boundaries still apply.
    """
    standbys_per_active: int = 0
    """Zero-VRAM standby pods staged on each active pod's GPU (GPU pools only)."""
    hold_min_tenure_s: float = 60.0
    """Hold breaking only touches pods at least this old."""
    preload: tuple[str, ...] = ()
    """Modules a pod's zygote imports once (never touching CUDA); jobs fork from it."""
    zygote: bool = True
    """Fork each job from a warm zygote interpreter; ``False`` execs a fresh interpreter."""
    network: str = "none"
    """What a sandboxed local pod's jobs may reach (``pod_runtime.network``): ``none``, its own
    network namespace with only its loopback (the host's loopback services out of reach), or
    ``outbound``, a namespace whose user-mode stack (pasta) reaches what the host reaches but
    the host's loopback and its primary address, with nothing forwarded in; or ``host``, the
    host's own network, loopback services included: an explicit opt-in for what needs it,
    such as a local gang whose ranks meet at ``MASTER_ADDR`` 127.0.0.1 (each pod of the other
    modes has a namespace of its own). Packages arrive either way (the broker's fetch
    socket). The Kubernetes backend leaves the network to the cluster (its NetworkPolicy)."""
    memory_limit_mb: int | None = None
    """Per-job memory limit, enforced where a writable cgroup v2 exists."""
    pids_limit: int | None = 4096
    """Per-job process limit, enforced where a writable cgroup v2 exists."""
    tmpfs_mb: int = 4096
    """Size cap, in MiB, of a sandboxed pod's private ``/tmp`` and of its ``/dev/shm`` (each):
    they live in the host's memory, and without a cap each could take half of it (bwrap's
    default). Jobs get ``TMPDIR`` on disk (their scratch); raise it for jobs that share
    big tensors through ``/dev/shm``."""
    template: str = "v1"
    """Pod template version; pods of another template are stale and retire when idle. A
    catalog whose pool gives a pod template (``pod_template``) gets ``t-<its digest>``, so
    changing the template retires the pods of the old one."""
    pod_template: PodTemplate | None = None
    """How the kubernetes backend makes this pool's pods (the catalog's ``template:``
    mapping); None: that backend refuses to create pods of this pool."""

    def __post_init__(self) -> None:
        """Raises ``InvalidRequest`` naming the first knob of the wrong type or out of range:
        a pool that can never scale (``step: 0``), a floor above its ceiling or a negative
        keep-alive would otherwise run quietly wrong."""
        for name in ("sku", "accelerator"):
            value = getattr(self, name)
            if not isinstance(value, str) or not POOL_NAME_RE.fullmatch(value):
                raise InvalidRequest(
                    f"pool {self.sku!r}: {name} must be 1-63 of a-z, 0-9, '_' and '-' "
                    f"(starting with a letter or digit), not {value!r}",
                    field=name,
                )
        if not isinstance(self.template, str) or not self.template:
            raise InvalidRequest(
                f"pool {self.sku!r}: template must be a non-empty string, not {self.template!r}",
                field="template",
            )
        for module in self.preload:
            if not isinstance(module, str) or not MODULE_RE.fullmatch(module):
                raise InvalidRequest(
                    f"pool {self.sku!r}: preload takes module names such as numpy or "
                    f"torch.nn, not {module!r}",
                    field="preload",
                )
        least = {"units_per_pod": 1, "min_count": 0, "max_idle_count": 0, "max_count": 0,
                 "step": 1, "standbys_per_active": 0, "tmpfs_mb": 1,
                 "drain_budget": 1}  # fmt: skip
        for name, low in least.items():
            _check_int(self.sku, name, getattr(self, name), low)
        for name in ("memory_limit_mb", "pids_limit"):
            if getattr(self, name) is not None:
                _check_int(self.sku, name, getattr(self, name), 1)
        for name in ("idle_timeout_s", "caller_hold_s", "hold_min_tenure_s"):
            value = getattr(self, name)
            if name == "caller_hold_s" and value is None:
                continue
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            if not ok or not value >= 0:  # NaN fails ``>=``; inf means never
                raise InvalidRequest(
                    f"pool {self.sku!r}: {name} must be a number of seconds >= 0, not {value!r}",
                    field=name,
                )
        if self.min_count > self.max_count:
            raise InvalidRequest(
                f"pool {self.sku!r}: the floor min_count ({self.min_count}) is above the "
                f"ceiling max_count ({self.max_count})",
                field="min_count",
            )
        if self.standbys_per_active and not self.is_gpu:
            raise InvalidRequest(
                f"pool {self.sku!r}: standbys_per_active needs a GPU accelerator, not cpu",
                field="standbys_per_active",
            )
        if self.tag_mode not in TAG_MODES:
            raise InvalidRequest(
                f"pool {self.sku!r}: tag_mode must be one of {', '.join(TAG_MODES)}, "
                f"not {self.tag_mode!r}",
                field="tag_mode",
            )
        if not isinstance(self.zygote, bool):
            raise InvalidRequest(f"pool {self.sku!r}: zygote must be true or false",
                                 field="zygote")  # fmt: skip
        if not isinstance(self.network, str) or self.network not in NETWORK_MODES:
            raise InvalidRequest(
                f"pool {self.sku!r}: network must be one of {', '.join(NETWORK_MODES)}, "
                f"not {self.network!r}",
                field="network",
            )

    @property
    def hold_s(self) -> float:
        return self.idle_timeout_s if self.caller_hold_s is None else self.caller_hold_s

    @property
    def is_gpu(self) -> bool:
        return self.accelerator != "cpu"


@dataclass(frozen=True, slots=True)
class CallerLimits:
    """Per-caller ceilings, checked in the same step as a claim (paper A.1). ``None`` = none."""

    max_pods: int | None = None
    """Pods the caller may hold assigned or running at once, across every pool."""
    max_gpus: int | None = None
    """GPUs (``units_per_pod`` of GPU pools) the caller may hold assigned or running."""

    def exceeded_by(self, pods: int, gpus: int) -> str | None:
        """The limit that holding ``pods`` pods and ``gpus`` GPUs at once would pass
        (``caller_pod_limit``, ``caller_gpu_limit``: the tracker's miss reasons), or None."""
        if self.max_pods is not None and pods > self.max_pods:
            return "caller_pod_limit"
        if self.max_gpus is not None and gpus and gpus > self.max_gpus:
            return "caller_gpu_limit"
        return None


@dataclass(frozen=True, slots=True)
class Catalog:
    """All pools plus the per-accelerator budgets they share."""

    pools: Mapping[str, PoolSpec]
    budgets: Mapping[str, int] = field(default_factory=dict)
    limits: CallerLimits = CallerLimits()
    """Default per-caller limits."""
    caller_limits: Mapping[str, CallerLimits] = field(default_factory=dict)
    """Per-caller overrides of ``limits``."""
    gpus: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """GPU UUIDs per accelerator this broker may use on the local backend; an accelerator not
    listed uses every card NVML reports whose name matches it (e.g. ``h200``)."""

    def __post_init__(self) -> None:
        """Raises ``InvalidRequest`` for a pool that can never place a pod: one pod of it is
        more than its accelerator's budget, or the other pools' floors on that budget keep
        every unit it would need (the floors are never reclaimed, so its jobs would queue
        forever beside idle floor pods)."""
        for sku, pool in self.pools.items():
            budget = self.budgets.get(pool.accelerator)
            if budget is None:
                continue
            floors = sum(
                other.min_count * other.units_per_pod
                for other in self.pools.values()
                if other.accelerator == pool.accelerator and other is not pool
            )
            own = max(1, pool.min_count) * pool.units_per_pod
            if floors + own > budget:
                raise InvalidRequest(
                    f"pool {sku!r} needs {own} {pool.accelerator} units for its "
                    f"{'floor' if pool.min_count > 1 else 'first pod'}, but the "
                    f"{pool.accelerator} budget is {budget} and the other pools' floors "
                    f"(min_count x units_per_pod) keep {floors} of it",
                    field=f"pools.{sku}",
                )

    def limits_for(self, caller: str) -> CallerLimits:
        return self.caller_limits.get(caller, self.limits)

    @property
    def has_limits(self) -> bool:
        everyone = (self.limits, *self.caller_limits.values())
        return any(lim.max_pods is not None or lim.max_gpus is not None for lim in everyone)

    def pool(self, sku: str) -> PoolSpec:
        try:
            return self.pools[sku]
        except KeyError:
            raise InvalidRequest(f"unknown sku {sku!r}", field="sku") from None

    def smallest_fit(self, need: Resources) -> PoolSpec:
        """The smallest pool that holds ``need`` (paper §4, SKU round-up): a CPU pool with
        at least ``ceil(need.cpu)`` cores per pod for a CPU request; a GPU pool of the asked
        accelerator (any, if none is named) with at least ``need.gpus`` GPUs per pod for a
        GPU one (a GPU pool's cores are not modelled); and, when memory is asked, a per-job
        memory limit at least that large (a pool without one has no cap). Smallest: fewest
        units per pod, then least memory, then name, so the choice is the same on every
        broker. ``InvalidRequest`` (field ``resources``) naming the largest pool of that
        kind when none fits."""
        gpu = need.wants_gpu
        kind = [
            pool
            for pool in self.pools.values()
            if pool.is_gpu == gpu and (not gpu or need.accelerator in (None, pool.accelerator))
        ]
        cores = max(1, need.gpus) if gpu else math.ceil(need.cpu)
        fits = [
            pool
            for pool in kind
            if pool.units_per_pod >= cores
            and (need.memory_mb is None or (pool.memory_limit_mb or math.inf) >= need.memory_mb)
        ]
        if fits:
            return min(fits, key=_pool_size)
        what = f"{need.accelerator} GPU" if need.accelerator else "GPU" if gpu else "CPU"
        if not kind:
            raise InvalidRequest(
                f"no pool fits {need.describe()}: the catalog has no {what} pool "
                f"(pools: {', '.join(sorted(self.pools))})",
                field="resources",
            )
        largest = max(kind, key=_pool_size)
        unit = "GPUs" if gpu else "cores"
        memory = largest.memory_limit_mb
        raise InvalidRequest(
            f"no pool fits {need.describe()}: the largest {what} pool is {largest.sku!r} "
            f"({largest.units_per_pod} {unit} per pod"
            f"{f', {memory} MiB' if memory is not None else ''})",
            field="resources",
        )

    def budget(self, accelerator: str) -> int | None:
        """Units available to ``accelerator`` across all its pools; ``None`` = unbounded."""
        return self.budgets.get(accelerator)

    def largest_gang(self, sku: str) -> int:
        """The most pods of pool ``sku`` one job can ever hold at once: its ``max_count``,
        and no more than its accelerator's budget holds. ``InvalidRequest`` for no such pool."""
        pool = self.pool(sku)
        budget = self.budget(pool.accelerator)
        if budget is None:
            return pool.max_count
        return min(pool.max_count, budget // max(1, pool.units_per_pod))

    @classmethod
    def default(cls) -> Catalog:
        """Zero-config catalog: one CPU pool sized for a workstation."""
        cpu = PoolSpec(sku="cpu", min_count=1, max_idle_count=2, max_count=8)
        return cls(pools={"cpu": cpu}, budgets={"cpu": 16})

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Catalog:
        """Raises ``UnknownField`` for a key it does not know and ``InvalidRequest`` for a
        value of the wrong shape or out of range, each naming the field."""
        data = _mapping(data, "the catalog")
        unknown = set(data) - {"pools", "budgets", "limits", "caller_limits", "gpus"}
        if unknown:
            name = sorted(unknown)[0]
            raise UnknownField(f"unknown catalog key {name!r}", field=name)
        known = {f.name for f in dataclasses.fields(PoolSpec)} - {"pod_template"}
        pools: dict[str, PoolSpec] = {}
        for sku, raw in _mapping(data.get("pools"), "pools").items():
            raw = dict(_mapping(raw, f"pool {sku!r}"))
            bad = set(raw) - known
            if bad:
                name = sorted(bad)[0]
                raise UnknownField(f"unknown key {name!r} in pool {sku!r}", field=name)
            raw["sku"] = sku
            if isinstance(raw.get("template"), Mapping):
                raw["pod_template"] = PodTemplate.from_mapping(raw["template"], sku)
                raw["template"] = f"t-{raw['pod_template'].digest}"
            if "preload" in raw:
                if not isinstance(raw["preload"], list | tuple):
                    raise InvalidRequest(f"pool {sku!r}: preload is a list of module names",
                                         field="preload")  # fmt: skip
                raw["preload"] = tuple(raw["preload"])
            pools[sku] = PoolSpec(**raw)
        if not pools:
            raise InvalidRequest("a catalog needs at least one pool", field="pools")
        budgets = {
            str(k): _count(v, f"budgets.{k}")
            for k, v in _mapping(data.get("budgets"), "budgets").items()
        }
        limits = _limits(_mapping(data.get("limits"), "limits"), "limits")
        callers = {
            str(c): _limits(_mapping(raw, f"caller_limits.{c}"), f"caller_limits.{c}")
            for c, raw in _mapping(data.get("caller_limits"), "caller_limits").items()
        }
        gpus: dict[str, tuple[str, ...]] = {}
        for acc, uuids in _mapping(data.get("gpus"), "gpus").items():
            if not isinstance(uuids, list | tuple | None):
                raise InvalidRequest(f"gpus.{acc} is a list of GPU UUIDs", field=f"gpus.{acc}")
            gpus[str(acc)] = tuple(str(u) for u in uuids or ())
        return cls(pools=pools, budgets=budgets, limits=limits, caller_limits=callers, gpus=gpus)

    @classmethod
    def load(cls, path: Path) -> Catalog:
        """The catalog in the YAML file ``path``; every error (``InvalidRequest``,
        ``UnknownField``) names the file, and the field where there is one."""
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise InvalidRequest(f"{path}: not valid YAML{where}: {problem}") from None
        if not isinstance(data, Mapping):
            raise InvalidRequest(f"{path}: a catalog is a mapping, not {type(data).__name__}")
        try:
            return cls.from_mapping(data)
        except FirepoolError as exc:
            raise type(exc)(f"{path}: {exc.message}", field=exc.field) from None


def _pool_size(pool: PoolSpec) -> tuple[int, float, str]:
    """How ``smallest_fit`` orders pools: units per pod, per-job memory (none: unbounded),
    name."""
    memory = math.inf if pool.memory_limit_mb is None else pool.memory_limit_mb
    return (pool.units_per_pod, memory, pool.sku)


def _check_int(sku: str, name: str, value: object, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise InvalidRequest(
            f"pool {sku!r}: {name} must be a whole number >= {low}, not {value!r}", field=name
        )


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    """``value`` if it is a mapping (an absent or empty section is an empty one)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidRequest(f"{where} is a mapping, not {type(value).__name__}", field=where)
    return value


def _count(value: object, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidRequest(f"{where} must be a whole number >= 0, not {value!r}", field=where)
    return value


def _limits(raw: Mapping[str, Any], where: str) -> CallerLimits:
    bad = set(raw) - {"max_pods", "max_gpus"}
    if bad:
        name = sorted(bad)[0]
        raise UnknownField(f"unknown key {name!r} in {where}", field=name)
    pods, gpus = raw.get("max_pods"), raw.get("max_gpus")
    return CallerLimits(
        max_pods=None if pods is None else _count(pods, f"{where}.max_pods"),
        max_gpus=None if gpus is None else _count(gpus, f"{where}.max_gpus"),
    )
