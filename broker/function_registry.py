"""Function versions as the broker serves them: registration (validated against the catalog,
the package store and the caller's uploads), deletion, and the caches in front of the job
store.

Two caches: every version read or registered, by ``(name, version)`` (shared with the
dispatcher, which reads a job's version on each start; versions never change, so it only
grows, and a delete drops the name's entries), and each name's latest version. A register or
delete of a name counts as a change of it (``_forget_latest``): a read of the latest that
overlapped one caches nothing, so a function deleted while it was being read is never served
from the cache afterwards. Event-loop only.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import Mapping

from broker.package_check import check_package_file
from broker.store import JobStore
from functions.errors import InvalidRequest, NotFound
from functions.spec import FunctionSpec
from functions.stores import PackageStore, local_file
from pod_runtime.jobenv import MAX_USER_VARS, MAX_VALUE, user_var_allowed
from pool_manager.catalog import Catalog


def check_function_env(env: Mapping[str, str]) -> None:
    """``InvalidRequest`` (field ``env``) for a variable the pod's agent would drop
    (``pod_runtime.jobenv.user_var_allowed``: a reserved name such as ``LD_PRELOAD``, a name
    that is not an identifier, a value over 32 KiB) or more than 256 of them: otherwise they
    would be stored, then silently missing from every job."""
    if len(env) > MAX_USER_VARS:
        raise InvalidRequest(
            f"env has {len(env)} variables; a job gets at most {MAX_USER_VARS}", field="env"
        )
    for name, value in env.items():
        if len(value) > MAX_VALUE:
            raise InvalidRequest(
                f"env {name}: the value is {len(value)} characters; the cap is {MAX_VALUE}",
                field="env",
            )
        if not user_var_allowed(name, value):
            raise InvalidRequest(
                f"env {name!r} is reserved by the pod or not a valid variable name "
                "(docs/pod_runtime.md lists the names a job's environment may not set)",
                field="env",
            )


class FunctionRegistry:
    def __init__(
        self,
        catalog: Catalog,
        packages: PackageStore,
        store: JobStore,
        versions: dict[tuple[str, int], FunctionSpec],
    ) -> None:
        self._catalog = catalog
        self._packages = packages
        self._store = store
        self._versions = versions
        self._latest: dict[str, FunctionSpec] = {}
        self._changes: Counter[str] = Counter()
        """Registers and deletes begun per function name (``_cache_latest``)."""

    def use_catalog(self, catalog: Catalog) -> None:
        """Validate registrations against ``catalog`` from now on (a catalog reload)."""
        self._catalog = catalog

    async def version(self, name: str, version: int) -> FunctionSpec | None:
        key = (name, version)
        spec = self._versions.get(key)
        if spec is None:
            spec = await self._store.get_function(name, version)
            if spec is not None:
                self._versions[key] = spec
        return spec

    async def latest(self, name: str) -> FunctionSpec:
        spec = self._latest.get(name)
        if spec is None:
            changes = self._changes[name]
            spec = await self._store.get_function(name)
            if spec is None:
                raise NotFound(f"no function named {name!r}")
            self._cache_latest(spec, changes)
            self._versions[(spec.name, spec.version)] = spec
        return spec

    def _cache_latest(self, spec: FunctionSpec, changes: int) -> None:
        """Cache ``spec`` as its name's latest version, unless a register or delete of the
        name ran while it was read or written (``changes`` is the count before): a read that
        began before a delete committed would otherwise cache the deleted function for good,
        served and invoked while the store has it gone."""
        if self._changes[spec.name] == changes:
            self._latest[spec.name] = spec

    async def register(self, spec: FunctionSpec, as_admin: bool = False) -> FunctionSpec:
        """Validate and store a new version of ``spec``. Raises ``InvalidRequest`` naming
        the field for a spec no job of it could ever run: an unknown pool or resources no
        pool fits (naming the largest pool), a gang larger than the pool's ceiling or its
        accelerator's budget; ``NotFound`` naming the field for a package (or requirements
        file) not uploaded, as ``HEAD /v1/packages`` answers it; and ``Forbidden`` for a name
        another deployer owns (unless ``as_admin``)."""
        if spec.resources is not None:  # the smallest pool that fits (paper §4)
            chosen = self._catalog.smallest_fit(spec.resources)
            spec = dataclasses.replace(spec, sku=chosen.sku, resources=None)
        spec.validate()
        check_function_env(spec.env)
        pool = self._catalog.pool(spec.sku)
        most = self._catalog.largest_gang(spec.sku)
        if spec.pods > most:
            raise InvalidRequest(
                f"pods ({spec.pods}) exceeds what pool {spec.sku!r} can ever hold at once "
                f"({most}: its max_count, and its {pool.accelerator} budget)",
                field="pods",
            )
        if not await self.may_use_package(spec.package_digest, spec.owner, as_admin):
            raise NotFound(
                "upload the package first (PUT /v1/packages/{sha256})", field="package_digest"
            )
        await asyncio.to_thread(self._check_package, spec.package_digest)
        if spec.requirements_digest and not await self.may_use_package(
            spec.requirements_digest, spec.owner, as_admin
        ):
            raise NotFound("upload the requirements file first", field="requirements")
        self._forget_latest(spec.name)
        try:
            # Not cached here: of registrations racing, this one's version may not be the
            # latest; the next read takes the latest from the store.
            stored = await self._store.put_function(spec, as_admin=as_admin)
        finally:
            self._forget_latest(spec.name)
        self._versions[(stored.name, stored.version)] = stored
        return stored

    async def may_use_package(self, digest: str, caller: str, as_admin: bool) -> bool:
        """Whether the package ``digest`` is stored and ``caller`` may register functions on
        it: an admin, or a caller who uploaded its bytes (``JobStore.uploaded_by``). Every
        other caller is told it is not there (no existence oracle)."""
        if not await asyncio.to_thread(self._packages.exists, digest):
            return False
        return as_admin or await self._store.uploaded_by(digest, caller)

    def _check_package(self, digest: str) -> None:
        """``PackageRejected`` unless the stored package is a zip the pod's agent will
        extract (``check_package_file``, on the store's own file where it keeps one)."""
        with local_file(self._packages, digest) as path:
            check_package_file(path)

    async def delete(self, name: str, caller: str | None = None) -> bool:
        """Hide every version of ``name``; ``Forbidden`` unless ``caller`` owns it (None: an
        admin). Its queued jobs then fail ``NotFound`` when their turn comes (the dispatcher
        reads the version again), as after a restart, rather than run the deleted version;
        running ones finish."""
        self._forget_latest(name)
        try:
            return await self._store.delete_function(name, caller)
        finally:
            self._forget_latest(name)
            for key in [key for key in self._versions if key[0] == name]:
                del self._versions[key]

    def _forget_latest(self, name: str) -> None:
        """Around a register or delete: drop the cached latest version, and make any read
        overlapping the write cache nothing (``_cache_latest``)."""
        self._changes[name] += 1
        self._latest.pop(name, None)
