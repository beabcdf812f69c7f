"""Whether a broker may start with its settings' pods: a job must never read the broker's
signing key (and so mint admin tokens) or its job store (every caller's inputs and outputs).

Only the sandbox (bubblewrap, ``pod_runtime.launch``) guarantees that: it hides the broker's
home from each pod and runs jobs as another uid. Where it cannot run, ``firepool serve``
refuses unless the operator opts in, and says so on the console.
"""

from __future__ import annotations

import getpass
import os

from broker.settings import Settings
from functions.errors import InvalidRequest
from pool_manager.backends.local import unsandboxed_reason


def check_pod_isolation(settings: Settings) -> str | None:
    """Whether ``firepool serve`` may start with ``settings``' pods: None when every job runs
    in the sandbox, where it sees none of the broker's state. Otherwise (no working bubblewrap,
    the sandbox off, or the fake backend, whose jobs run in the broker's process) each job
    would run as the broker's user and read its signing key (and so mint admin tokens) and its
    job store: ``InvalidRequest`` naming the variable, unless the operator opted in
    (``allow_unsandboxed``), and then the warning to show on the console."""
    if settings.backend == "kubernetes":  # a pod is a container of its own, elsewhere
        return None
    if settings.backend == "fake":
        why = "FIREPOOL_BACKEND=fake runs every job inside the broker's own process"
        fix = "Run them on local pods (FIREPOOL_BACKEND=local) to sandbox them"
    else:
        reason = unsandboxed_reason(settings.sandbox)
        if reason is None:
            return None
        if settings.sandbox:
            raise InvalidRequest(
                f"FIREPOOL_SANDBOX=1 but pods cannot be sandboxed here: {reason}",
                field="FIREPOOL_SANDBOX",
            )
        why, fix = reason, "Install bubblewrap (apt-get install bubblewrap) to sandbox them"
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # a uid without a name (a container's)
        user = f"uid {os.getuid()}"
    exposed = (
        f"pods are not sandboxed here ({why}): every job would run as this broker's user "
        f"({user}) and could read its signing key (and so mint admin tokens) and its job store "
        "(every caller's inputs and outputs)"
    )
    if not settings.allow_unsandboxed:
        raise InvalidRequest(
            f"{exposed}. {fix}, or, if every caller may act as this user, start anyway with "
            "FIREPOOL_ALLOW_UNSANDBOXED=1 (`firepool serve --allow-unsandboxed`)",
            field="FIREPOOL_ALLOW_UNSANDBOXED",
        )
    return (
        f"WARNING: {exposed}. Started anyway (FIREPOOL_ALLOW_UNSANDBOXED=1): give tokens only "
        "to callers who may act as this user; install bubblewrap (apt-get install bubblewrap) "
        "and restart to sandbox every job."
    )
