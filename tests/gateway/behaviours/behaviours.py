"""Functions whose behaviour the broker tests observe (deployed as a package)."""

import os
import sys
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


def ticker_undecodable(request):
    """``ticker`` whose lines each start with bytes that are not UTF-8."""
    for i in range(int(request)):
        sys.stdout.buffer.write(b"\xff\xfe tick %d\n" % i)
        sys.stdout.buffer.flush()
        time.sleep(0.3)
    return "ticked"


def nested(request):
    """A value ``request`` lists deep."""
    value = []
    for _ in range(int(request) - 1):
        value = [value]
    return value


def snoop(request):
    """What a job can see of the broker's state directory ``request`` and of its own pod's
    records, and what it can do to them (tests/gateway/test_pod_isolation.py)."""
    import pathlib

    home = pathlib.Path(request)
    pods = home / "pods"
    seen = {
        "home": sorted(p.name for p in home.iterdir()) if home.is_dir() else None,
        "pods": sorted(p.name for p in pods.iterdir()) if pods.is_dir() else None,
        "canaries": sorted(k for k, v in os.environ.items() if "canary" in v),
        "wrote": [],
    }
    for name in seen["pods"] or []:  # try to disown the pod: rewrite or shadow its records
        for target in (pods / f"{name}.json", pods / name / "pod.json"):
            try:
                target.write_text('{"annotations": {}}')
                seen["wrote"].append(str(target.relative_to(home)))
            except OSError:
                pass
    return seen


def read(request):
    """The text of the file ``request`` (test_pod_isolation: what a job cannot read)."""
    with open(request) as f:
        return f.read()


def shout(request):
    """Print ``request`` bytes of numbered lines (test_operations: a log of several chunks)."""
    written = 0
    line = 0
    while written < int(request):
        text = f"line {line:08d} " + "z" * 80 + "\n"
        print(text, end="")
        written += len(text)
        line += 1
    return written


def sized(request):
    """A string of ``request`` double quotes (each sent escaped, and escaped again by MySQL)."""
    return '"' * int(request)


def connect(request):
    """Whether the unix socket ``request`` answers a connect (test_pod_isolation)."""
    import socket

    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(request)
        except OSError as exc:
            return f"refused: {exc}"
    return "connected"


def ticker_tagged(request):
    """``ticker`` whose lines carry a tag of the attempt that printed them."""
    import uuid

    tag = uuid.uuid4().hex[:6]
    for i in range(int(request)):
        print(f"{tag} tick {i}", flush=True)
        time.sleep(0.1)
    return "ticked"
