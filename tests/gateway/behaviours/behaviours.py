"""Functions whose behaviour the broker tests observe (deployed as a package)."""

import os
import time


def fail(request):
    raise ValueError(f"bad input: {request!r}")


def exit3(request):
    os._exit(3)


def sleep(request):
    time.sleep(float(request))
    return "slept"


def chatty(request):
    import sys

    print(f"hello from the job: {request}", flush=True)
    print("and a warning on stderr", file=sys.stderr, flush=True)
    return "done"


def whoami(request):
    return {"caller": os.environ.get("FIREPOOL_CALLER"), "pid": os.getpid()}


def ranks(request):
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "FIREPOOL_CALLER")
    return {k: os.environ.get(k) for k in keys}


def gpu_env(request):
    return {
        k: v
        for k, v in os.environ.items()
        if k.startswith(("CUDA_", "NVIDIA_")) or k == "FIREPOOL_POD"
    }


def ticker(request):
    for i in range(int(request)):
        print(f"tick {i}", flush=True)
        time.sleep(0.3)
    return "ticked"


def nested(request):
    """A value ``request`` lists deep."""
    value = []
    for _ in range(int(request) - 1):
        value = [value]
    return value
