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


def rendezvous(request):
    """Rank 0 listens at MASTER_ADDR:MASTER_PORT (that address only, as a cluster pod's
    rank 0 would at its pod IP); rank 1 connects there and they swap a line each. Returns
    the rank's env and what it heard."""
    import socket

    env = {k: os.environ.get(k) for k in (
        "RANK", "NODE_RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
        "MASTER_PORT",
    )}  # fmt: skip
    address = (env["MASTER_ADDR"], int(env["MASTER_PORT"]))
    deadline = time.monotonic() + float(request or 20)
    if env["RANK"] == "0":
        with socket.create_server(address) as server:
            server.settimeout(max(0.1, deadline - time.monotonic()))
            peer, _ = server.accept()
            with peer, peer.makefile("rw") as stream:
                heard = stream.readline().strip()
                stream.write(f"welcome from rank 0 at {address[0]}\n")
                stream.flush()
        return {**env, "heard": heard}
    while True:  # rank 0 may not listen yet
        try:
            peer = socket.create_connection(address, timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    with peer, peer.makefile("rw") as stream:
        stream.write(f"hello from rank {env['RANK']}\n")
        stream.flush()
        heard = stream.readline().strip()
    return {**env, "heard": heard}


def gang_pids(request):
    """Each rank appends its pid to ``<dir>/rank-<RANK>.runs`` (one line per run), then
    sleeps ``seconds``. ``request``:
    ``{"dir": ..., "seconds": ...}``."""
    rank = os.environ["RANK"]
    with open(os.path.join(request["dir"], f"rank-{rank}.runs"), "a") as runs:
        runs.write(f"{os.getpid()}\n")
    time.sleep(float(request["seconds"]))
    return {"rank": rank, "pid": os.getpid()}


def rank_one_fails(request):
    """Rank 1 fails at once; every other rank sleeps ``request`` seconds."""
    if os.environ.get("RANK") == "1":
        raise RuntimeError("rank 1 gave up")
    time.sleep(float(request))
    return "slept"


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


def tamper(request):
    """What a job may do to its own agent and pod (test_pod_isolation): its uid, whether it
    may signal the agent and the zygote, replace the agent's socket, rewrite the pod's kept
    caches or read the root-only file ``request``; and whether its own places are writable."""
    import pathlib

    def attempt(action):
        try:
            action()
            return "allowed"
        except OSError as exc:
            return type(exc).__name__

    helpers = {}  # the agent, and the zygote that forked this job (its parent)
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"pod_runtime.agent" in argv:
                helpers["agent"] = int(entry.name)
            elif b"pod_runtime.zygote" in argv and int(entry.name) == os.getppid():
                helpers["zygote"] = int(entry.name)
    pod = pathlib.Path(os.environ["FIREPOOL_SCRATCH_DIR"]).parent.parent
    seen = {"uid": os.getuid(), "helpers": sorted(helpers)}
    for role, pid in helpers.items():
        seen[f"signal {role}"] = attempt(lambda pid=pid: os.kill(pid, 0))
    seen["replace agent.sock"] = attempt(lambda: os.rename(pod / "agent.sock", pod / "x.sock"))
    seen["write site cache"] = attempt(lambda: (pod / "cache" / "site" / "evil.pth").touch())
    seen["read root-only"] = attempt(lambda: pathlib.Path(request).read_text())
    seen["update a shipped file"] = attempt(lambda: open("behaviours.py", "a").close())
    seen["pod cgroups"] = _pod_cgroups()
    for place in ("/tmp", "/dev/shm"):
        fs = os.statvfs(place)
        seen[f"{place} MiB"] = fs.f_blocks * fs.f_frsize // (1024 * 1024)
    places = {"cwd": ".", "TMPDIR": os.environ["TMPDIR"], "HOME": os.environ["HOME"]}
    for label, place in {**places, "/tmp": "/tmp", "/dev/shm": "/dev/shm"}.items():
        seen[f"write {label}"] = attempt(lambda p=place: pathlib.Path(p, "mine").touch())
    return seen


def _pod_cgroups():
    """The pods' cgroups this job can list (its own only), or None without cgroup v2 pods."""
    import pathlib

    with open("/proc/self/mountinfo") as info:
        mounts = [line.split() for line in info]
    v2 = [m[4] for m in mounts if m[m.index("-") + 1] == "cgroup2"]
    with open("/proc/self/cgroup") as own:
        path = next((line[3:].strip() for line in own if line.startswith("0::")), "")
    if not v2 or "/firepool/" not in path:
        return None
    pods = pathlib.Path(v2[0] + path[: path.index("/firepool/")], "firepool")
    return sorted(p.name for p in pods.iterdir() if p.is_dir())


def plant_result(request):
    """Leave the result file as a symlink to ``request`` and exit before ``job_main`` writes
    it: the agent must not read what the job could not (test_pod_isolation)."""
    out = os.path.dirname(os.environ["FIREPOOL_OUTPUT_FILE"])
    os.symlink(request, os.path.join(out, "result.json"))
    sys.stdout.flush()
    os._exit(0)


def leave_traces(request):
    """Whether the previous job's traces are still here (a marker in scratch, which the
    pod's reset wipes), then leave new ones: the marker and a sleeping child the reset must
    kill (test_answer_before_reset)."""
    import pathlib
    import subprocess

    marker = pathlib.Path(os.environ["FIREPOOL_SCRATCH_DIR"], "previous-job")
    found = marker.exists()
    marker.write_text(str(request))
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    return {"found_previous": found, "pid": os.getpid()}
