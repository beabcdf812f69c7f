"""The ``firepool`` command: serve the broker, mint tokens, and act as a client.

Client commands read ``FIREPOOL_URL`` (default http://127.0.0.1:8080) and ``FIREPOOL_TOKEN``
(or ``--url`` and ``--token``, before or after the command); state lives under
``FIREPOOL_HOME`` (default ./.firepool). Exit status: ``EXIT_STATUS``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import signal
import socket
import sys
import textwrap
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

import httpx
import orjson

from broker.settings import LOG_FORMATS, Settings
from functions.errors import Conflict, FirepoolError, InvalidRequest, Unauthorized
from functions.sdk import Client, ClientError, UnexpectedAnswer
from gateway.auth import Authenticator, Role, load_key

if TYPE_CHECKING:
    from broker.service import Broker

EXIT_STATUS = """\
exit status:
  0  done; for invoke and logs --follow, the job SUCCEEDED
  1  the job FAILED or was CANCELLED (invoke, logs --follow)
  2  refused or unreachable: a bad option or input, the gateway's typed error
     (printed as one `error:` line), no answer, or an answer that is not the API's
  130  interrupted by Ctrl-C (SIGINT); serve exits so once it has stopped cleanly"""

log = logging.getLogger("firepool.serve")


def _port(text: str) -> int:
    """A TCP port, 1-65535 (a larger one wrapped around in the socket call)."""
    port = int(text)
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a port (1-65535)")
    return port


def _seconds(text: str) -> float:
    """A finite number of seconds above 0 (``nan`` would go as JSON null: the default)."""
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a number of seconds above 0")
    return value


def positive_int(text: str) -> int:
    """A whole number above 0 (an argparse type; the benchmarks use it too)."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a whole number above 0")
    return value


def _env_pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return name, value


def _print(obj: Any) -> None:
    sys.stdout.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2).decode() + "\n")


def _gateway_url(args: argparse.Namespace) -> str:
    url = getattr(args, "url", None)
    return str(url or os.environ.get("FIREPOOL_URL", "http://127.0.0.1:8080"))


def _client(args: argparse.Namespace) -> Client:
    token = getattr(args, "token", None) or os.environ.get("FIREPOOL_TOKEN")
    if not token:
        raise Unauthorized(
            "no token: set FIREPOOL_TOKEN or --token (mint one with `firepool token --caller NAME`)"
        )
    return Client(_gateway_url(args), token)


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from broker.pod_isolation import check_pod_isolation
    from broker.service import Broker
    from broker.store import check_store
    from gateway.app import create_app
    from gateway.log_format import configure_logging

    allow = args.allow_unsandboxed or None  # the flag wins; without it, the variable
    settings = Settings.from_env(
        host=args.host, port=args.port, allow_unsandboxed=allow, log_format=args.log_format
    )
    unsandboxed = check_pod_isolation(settings)  # refused before the home is touched
    configure_logging(settings.log_format)
    broker = Broker(settings)
    with _store_answers(settings.resolved_store_url):  # a MySQL lock connects
        broker.locks.acquire()  # a second broker on this home or store: one error line, exit 2
        _check_bindable(settings.host, settings.port)  # before the store gets its tables
        # Not Firepool's, or another schema version: refused here, not in the app's startup
        # (uvicorn's traceback and exit 3); an empty database gets Firepool's tables.
        check_store(settings.resolved_store_url)
    app = create_app(broker)
    _log_start(broker)

    class Server(uvicorn.Server):
        """uvicorn's server whose stop signal (SIGINT, SIGTERM) also stops the broker's
        intake at once: uvicorn first waits up to ``drain_s`` for the requests in flight, and
        only then stops the application, which would start queued jobs meanwhile."""

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            with contextlib.suppress(RuntimeError):  # no loop running yet: nothing to stop
                asyncio.get_running_loop().call_soon_threadsafe(broker.stop_intake)
            super().handle_exit(sig, frame)

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            """Once the broker has started: SIGHUP reloads its catalog file."""
            await super().startup(sockets)
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, broker.request_reload)

    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="warning",
        log_config=None,  # uvicorn's own lines go through the handler set above (text or JSON)
        access_log=False,
        loop="uvloop",
        http="httptools",
        timeout_graceful_shutdown=int(settings.drain_s),
    )
    if unsandboxed is not None and settings.log_format == "json":  # one JSON line, as the rest
        log.warning("%s", unsandboxed.removeprefix("WARNING: "))
    elif unsandboxed is not None:  # on the console, one paragraph, once nothing refuses it
        sys.stderr.write(textwrap.fill(unsandboxed, 100) + "\n")
        sys.stderr.flush()
    Server(config).run()
    return 0


def _log_start(broker: Broker) -> None:
    """One line with what this broker serves and with what: its address, state directory,
    job store (without its password), pod backend and the catalog's pools (floor-ceiling)."""
    from sqlalchemy.engine import make_url

    settings = broker.settings
    store = make_url(settings.resolved_store_url).render_as_string(hide_password=True)
    pools = ", ".join(
        f"{name} [{pool.min_count}-{pool.max_count}]" for name, pool in broker.catalog.pools.items()
    )
    log.info(
        "starting on http://%s:%d: home %s, store %s, backend %s, pools %s",
        settings.host, settings.port, settings.home, store, settings.backend, pools or "none",
    )  # fmt: skip


def _check_bindable(host: str, port: int) -> None:
    """Refuse, before any pod starts, an address this process cannot listen on (in use,
    not this machine's): uvicorn finds out only after the broker has started its pods, and
    exits 3 with its own lines."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(infos[0][4])
    except OSError as exc:
        raise InvalidRequest(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


@contextlib.contextmanager
def _store_answers(url: str) -> Iterator[None]:
    """Run a block that connects to the job store at ``url``: a database that does not answer
    (down, unreachable, refusing the login) or is not a Firepool one is one ``error:`` line
    and exit 2, like a gateway that does not answer (not about 120 lines of three
    tracebacks for an unreachable MySQL). The URL is shown without its password."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    from broker.store import SchemaError

    try:
        yield
    except (SQLAlchemyError, SchemaError) as exc:
        why = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        shown = make_url(url).render_as_string(hide_password=True)
        raise InvalidRequest(f"the job store {shown} (FIREPOOL_STORE_URL): {why}") from None


def cmd_token(args: argparse.Namespace) -> int:
    if not args.caller.strip():
        raise InvalidRequest("--caller must name someone (the gateway refuses an empty one)")
    settings = Settings.from_env()
    try:  # never made here: a key of its own would sign tokens the broker refuses (401)
        key = load_key(settings.home / "signing.key")
    except FileNotFoundError:
        raise InvalidRequest(
            f"no signing key in {settings.home}: no broker has been started with "
            f"FIREPOOL_HOME={settings.home}; start it first (`firepool serve`), or point "
            "FIREPOOL_HOME at its state directory"
        ) from None
    auth = Authenticator(key, settings.audience)
    print(auth.mint(args.caller, Role(args.role), ttl_s=args.ttl or settings.token_ttl_s))
    return 0


def _refuse_while_served(home: Path) -> None:
    """``Conflict`` naming the broker's pid if one serves ``home``: stopping its pods would
    kill the jobs running on them (their user code would then run a second time) and the
    broker would make new pods at once. Takes the home's lock and gives it back at once."""
    from broker.exclusive import BrokerLocks  # SQLAlchemy: only ``down`` pays for it

    lock = BrokerLocks(home, store_url="")
    try:
        lock.acquire_home()
    except Conflict:
        pid = (home / "broker.lock").read_text().strip() or "unknown"
        raise Conflict(
            f"a broker (pid {pid}) is serving FIREPOOL_HOME={home}: stopping its pods would "
            "fail the jobs running on them, and it would start new ones; stop the broker "
            "first (Ctrl-C), or pass --force"
        ) from None
    finally:
        lock.release()


def _running_pods(pods: Path) -> int:
    """How many pod records under ``pods`` name a live launcher (a stopped pod's record and
    directory stay until the next ``firepool serve`` deletes them)."""
    from pool_manager.backends.local import pid_alive

    running = 0
    for record in pods.glob("*.json"):
        try:
            pid = json.loads(record.read_text()).get("pid")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(pid, int) and pid_alive(pid):
            running += 1
    return running


def cmd_down(args: argparse.Namespace) -> int:
    from gateway.harness import kill_pods

    home = Settings.from_env().home
    if not home.is_dir():  # a typo in FIREPOOL_HOME would say "stopped 0", pods running on
        raise InvalidRequest(f"FIREPOOL_HOME={home} does not exist: no pods to stop there")
    if not args.force:
        _refuse_while_served(home)
    running = _running_pods(home / "pods")
    kill_pods(home)
    if running:
        print(f"stopped {running} running pod(s) under {home / 'pods'}")
    else:
        print(f"no running pods under {home / 'pods'}")
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    from broker.store import migrate

    settings = Settings.from_env()
    with _store_answers(settings.resolved_store_url):
        migrate(settings.resolved_store_url)
    print(f"migrated {settings.resolved_store_url}")
    return 0


def cmd_deploy(args: argparse.Namespace) -> int:
    from functions.client.progress import DeployProgress

    needs = {k: getattr(args, k) for k in ("cpu", "memory", "gpus", "accelerator")}
    resources = {k: v for k, v in needs.items() if v is not None} or None
    with _client(args) as fp, DeployProgress() as progress:
        version = fp.deploy(
            args.dir,
            name=args.name,
            sku=args.sku,
            resources=resources,
            entrypoint=args.entrypoint,
            command=args.command,
            requirements=args.requirements,
            env=dict(args.env or []),
            timeout_s=args.timeout,
            max_retries=args.retries,
            pods=args.pods,
            single_use=args.single_use,
            progress=progress,
        )
    sent = version.pop("uploaded_bytes")
    digest = str(version.get("package_digest", ""))[:12]
    if sent:
        sys.stderr.write(f"uploaded {sent} bytes (package {digest})\n")
    else:
        sys.stderr.write(f"uploaded nothing (0 bytes): the gateway has package {digest}\n")
    _print(version)
    return 0


def _input_text(given: str) -> str | bytes:
    """``--input``'s JSON: the argument itself, ``@FILE``'s bytes, or stdin's for ``-`` (for
    inputs past the argument limit; JSON never starts with ``@`` nor is ``-``)."""
    if given == "-":
        return sys.stdin.buffer.read()
    if given.startswith("@"):
        return Path(given[1:]).read_bytes()  # a missing file: one error line (``main``)
    return given


def cmd_invoke(args: argparse.Namespace) -> int:
    text = _input_text(args.input)
    where = "" if text is args.input else f" ({args.input})"
    try:  # the standard parser: orjson reads an integer past 64 bits as a float, silently
        payload = json.loads(text, parse_constant=_no_constant)
    except ValueError as exc:  # UnicodeDecodeError too: a file that is not UTF-8
        raise InvalidRequest(f"--input{where} is not JSON: {exc}", field="input") from None
    options: dict[str, Any] = {
        "lease_tag": args.tag,
        "queue": args.queue,
        "priority": args.priority,
        "timeout_s": args.timeout,
        "idempotency_key": args.idempotency_key,
    }
    with _client(args) as fp:
        if args.async_:
            print(fp.submit(args.name, payload, **options))
        else:
            job = fp.invoke(args.name, payload, **options)
            _print(job)
            return 0 if job["state"] == "SUCCEEDED" else 1
    return 0


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


JOB_COLUMNS = ("ID", "FUNCTION", "STATE", "PATH", "SUBMITTED", "DURATION")


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.2f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def job_row(job: dict[str, Any], now: float) -> tuple[str, ...]:
    """A job record as ``JOB_COLUMNS``: its acquisition path (``-`` before it started), the
    local time it was submitted, and how long it ran (so far, while it runs; ``-`` before it
    started)."""
    timings = job.get("timings") or {}
    submitted, started = timings.get("submitted"), timings.get("started")
    finished = timings.get("finished")
    return (
        str(job["id"]),
        f"{job['function']} v{job['version']}",
        str(job["state"]),
        str((job.get("acquisition") or {}).get("path") or "-"),
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(submitted)) if submitted else "-",
        _duration(max(0.0, (finished or now) - started)) if started else "-",
    )


def _print_table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=True)]
        sys.stdout.write("  ".join(cells).rstrip() + "\n")


def cmd_jobs(args: argparse.Namespace) -> int:
    with _client(args) as fp:
        if args.id:
            _print(fp.job(args.id))
            return 0
        jobs = fp.jobs(state=args.state, limit=args.limit)
    if args.json:
        _print(jobs)
    else:
        now = time.time()
        _print_table([JOB_COLUMNS, *(job_row(job, now) for job in jobs)])
    return 0


def job_ending(job: dict[str, Any]) -> str:
    """How a job ended, in one line: its state, its error's class and message (on one line,
    at most 300 characters) and its exit code, where it has them."""
    line = f"job {job['id']} {job['state']}"
    error = job.get("error")
    if error:
        message = " ".join(str(error.get("message", "")).split())
        if len(message) > 300:
            message = message[:297] + "..."
        line += f": {error.get('class')}: {message}"
    if job.get("exit_code") is not None:
        line += f" (exit code {job['exit_code']})"
    return line


def cmd_logs(args: argparse.Namespace) -> int:
    with _client(args) as fp:
        out = sys.stdout.buffer  # the job's bytes as it wrote them, each chunk as it comes
        for chunk in fp.iter_logs(args.id, follow=args.follow):
            out.write(chunk)
            out.flush()
        if not args.follow:
            return 0
        job = fp.wait(args.id)  # the log ends as the job does; its outcome is recorded then
    sys.stderr.write(job_ending(job) + "\n")  # stdout stays the job's own bytes
    return 0 if job["state"] == "SUCCEEDED" else 1


def cmd_cancel(args: argparse.Namespace) -> int:
    with _client(args) as fp:
        _print(fp.cancel(args.id))
    return 0


def cmd_functions(args: argparse.Namespace) -> int:
    if args.delete and not args.name:
        raise InvalidRequest("--delete needs the function's NAME", field="name")
    with _client(args) as fp:
        if args.delete:
            _print(fp.delete_function(args.name))
        else:
            _print(fp.describe_function(args.name) if args.name else fp.functions())
    return 0


def cmd_pools(args: argparse.Namespace) -> int:
    with _client(args) as fp:
        _print(fp.pools())
    return 0


def _gateway_options(default: Any) -> argparse.ArgumentParser:
    """``--url`` and ``--token``, as a parent parser: the top parser's default None, each client
    command's ``SUPPRESS`` (so that one given before the command is not reset after it)."""
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--url", default=default, help="gateway URL (FIREPOOL_URL)")
    options.add_argument("--token", default=default, help="bearer token (FIREPOOL_TOKEN)")
    return options


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="firepool",
        description=__doc__.split("\n")[0],
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[_gateway_options(None)],
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    gateway_options = _gateway_options(argparse.SUPPRESS)

    def client(name: str, help: str) -> argparse.ArgumentParser:
        """A command that talks to the gateway: takes ``--url`` and ``--token`` after it."""
        return sub.add_parser(
            name,
            help=help,
            parents=[gateway_options],
            epilog=EXIT_STATUS,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    s = sub.add_parser("serve", help="run the broker")
    s.add_argument("--host", default=None, help="address to bind (default 127.0.0.1)")
    s.add_argument("--port", type=_port, default=None, help="port to bind (default 8080)")
    s.add_argument(
        "--allow-unsandboxed",
        action="store_true",
        help="start even where local pods cannot be sandboxed (no bubblewrap): every job then "
        "runs as this user and can read the signing key and the job store "
        "(FIREPOOL_ALLOW_UNSANDBOXED=1)",
    )
    s.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=None,
        help="log lines as readable text or as one JSON object each (FIREPOOL_LOG_FORMAT; "
        "default text)",
    )
    s.set_defaults(fn=cmd_serve)

    s = sub.add_parser("token", help="mint a bearer token (printed as the last line)")
    s.add_argument("--caller", required=True, help="the token's subject: who calls")
    s.add_argument(
        "--role", default="invoke", choices=[r.value for r in Role], help="default: %(default)s"
    )
    s.add_argument("--ttl", type=positive_int, help="lifetime in seconds (default 30 days)")
    s.set_defaults(fn=cmd_token)

    s = sub.add_parser(
        "down",
        help="stop every local pod (they outlive the broker by design)",
        description="Stop every local pod under FIREPOOL_HOME (they outlive the broker by "
        "design). Refused while a broker serves the home: stop it first. The pods' directories "
        "and records stay, with their logs, until the next `firepool serve` there deletes them.",
    )
    s.add_argument(
        "--force",
        action="store_true",
        help="stop them even while a broker serves the home: its running jobs lose their pods "
        "(and run again) and it starts new pods",
    )
    s.set_defaults(fn=cmd_down)

    s = sub.add_parser("migrate", help="bring the job store schema to the current version")
    s.set_defaults(fn=cmd_migrate)

    s = client(
        "deploy",
        "package DIR and register a function version (DIR/firepool.toml gives what no flag "
        "does; DIR/.firepoolignore leaves files out)",
    )
    s.add_argument(
        "dir",
        type=Path,
        help="the function's code directory (packaged and uploaded once per content)",
    )
    s.add_argument("--name", help="function name: [a-z0-9][a-z0-9_-]{0,62}")
    s.add_argument("--sku", help="hardware pool to run on (the catalog's), or ask for resources:")
    s.add_argument("--cpu", type=float, help="cores; the smallest pool that fits is chosen")
    s.add_argument("--memory", type=int, help="MiB per job")
    s.add_argument("--gpus", type=int, help="GPUs per pod")
    s.add_argument("--accelerator", help="GPU model (the catalog's accelerator name)")
    s.add_argument("--entrypoint", help="module:function called with the input")
    s.add_argument("--command", nargs="+", help="a program to run instead of an entrypoint")
    s.add_argument("--requirements", type=Path, help="a pip requirements file")
    s.add_argument(
        "--env",
        action="append",
        type=_env_pair,
        metavar="KEY=VALUE",
        help="environment variable (repeatable)",
    )
    s.add_argument("--timeout", type=_seconds, help="seconds per attempt (default 300)")
    s.add_argument("--retries", type=int, help="retries of a lost or failed attempt (default 2)")
    s.add_argument("--pods", type=int, help="pods per job, a gang (default 1)")
    s.add_argument(
        "--single-use",
        action=argparse.BooleanOptionalAction,
        help="a fresh pod per job, deleted after it",
    )
    s.set_defaults(fn=cmd_deploy)

    s = client("invoke", "invoke a function")
    s.add_argument("name")
    s.add_argument(
        "--input",
        default="null",
        help="JSON input, @FILE to read it from a file, or - from stdin (default null)",
    )
    s.add_argument("--tag", help="lease tag: jobs with one tag reuse the caller's warm pods")
    s.add_argument("--queue", help="queue name (default: default)")
    s.add_argument("--priority", type=int, help="higher runs first (default 0)")
    s.add_argument("--timeout", type=_seconds, help="seconds (default: the function's)")
    s.add_argument("--idempotency-key", help="a retried call with the same key is one job")
    s.add_argument("--async", dest="async_", action="store_true", help="print the job id")
    s.set_defaults(fn=cmd_invoke)

    s = client("jobs", "list your jobs (every caller's for admin), or show one")
    s.add_argument("id", nargs="?", help="show this job's whole record (JSON)")
    s.add_argument("--json", action="store_true", help="the records as JSON, not a table")
    s.add_argument("--state", help="only jobs in this state (QUEUED, RUNNING, SUCCEEDED, ...)")
    s.add_argument(
        "--limit",
        type=int,
        default=20,
        help="at most this many, newest first (default 20, at most 1000)",
    )
    s.set_defaults(fn=cmd_jobs)

    s = client("logs", "print a job's logs")
    s.add_argument("id")
    s.add_argument(
        "--follow",
        action="store_true",
        help="stream until the job ends, then print how it ended on stderr and exit as invoke does",
    )
    s.set_defaults(fn=cmd_logs)

    s = client("cancel", "cancel a job")
    s.add_argument("id")
    s.set_defaults(fn=cmd_cancel)

    s = client("functions", "list functions, show one, or delete one")
    s.add_argument("name", nargs="?", help="show this function's latest version")
    s.add_argument("--delete", action="store_true", help="delete NAME (deploy role)")
    s.set_defaults(fn=cmd_functions)
    client("pools", "pool status (admin)").set_defaults(fn=cmd_pools)
    sub.add_parser("simulate", help="run the virtual-time simulator (simulate --help)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["simulate"]:  # the simulator parses its own options
        try:
            from simulator.cli import main as simulate_main
        except ModuleNotFoundError as exc:  # numpy: the simulator's extra, not the broker's
            sys.stderr.write(
                f"error: firepool simulate needs {exc.name}: pip install 'firepool[simulate]'\n"
            )
            return 2

        return simulate_main([a for a in argv[1:] if a != "--"])
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args))
    except UnexpectedAnswer as exc:  # a wrong URL: its page is not worth printing
        sys.stderr.write(f"error: {exc} (--url or FIREPOOL_URL)\n")
        return 2
    except ClientError as exc:  # the gateway's typed refusal (``ApiError``)
        sys.stderr.write(f"error: {exc}\n")
        return 2
    except FirepoolError as exc:  # a bad local input, e.g. the catalog ``serve`` loads
        sys.stderr.write(f"error: {exc}\n")
        return 2
    except httpx.TransportError as exc:  # refused, unresolvable, timed out: no answer at all
        sys.stderr.write(
            f"error: no answer from the gateway at {_gateway_url(args)} "
            f"({type(exc).__name__}: {exc}); is `firepool serve` running there? "
            "(--url or FIREPOOL_URL)\n"
        )
        return 2
    except httpx.InvalidURL as exc:
        sys.stderr.write(f"error: the gateway URL {_gateway_url(args)!r} is not a URL: {exc}\n")
        return 2
    except OSError as exc:  # a file named on the command line or by the environment
        where = f": {exc.filename}" if exc.filename else ""
        sys.stderr.write(f"error: {exc.strerror or exc}{where}\n")
        return 2
    except KeyboardInterrupt:  # Ctrl-C; for serve, uvicorn re-raises it after a clean stop
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
