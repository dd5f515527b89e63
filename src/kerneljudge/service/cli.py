"""``kerneljudge serve``: the judge service on this machine (FastAPI + uvicorn).

Also :func:`remote_eval`, the ``kerneljudge eval --server`` path, and
:func:`local_service_eval`, ``eval``'s use of a local service found by its discovery file.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

if TYPE_CHECKING:
    from kerneljudge.candidate import Candidate
    from kerneljudge.executors.base import Executor
    from kerneljudge.judge import JudgeConfig
    from kerneljudge.verdict import Verdict

__all__ = ["is_loopback", "local_service_eval", "serve_command", "remote_eval", "MISSING_SERVE"]

MISSING_SERVE = "the judge service needs FastAPI, uvicorn and httpx: install kerneljudge[serve]"


def is_loopback(host: str) -> bool:
    """True when ``host`` (a name or an address) reaches this machine only: ``localhost`` or
    an address in 127.0.0.0/8 or ::1. Empty, ``0.0.0.0``, ``::`` and every other name: False."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def build_executor(cpu_slots: int | None, devices: tuple[str, ...]) -> Executor:
    """The executor of ``kerneljudge serve``: :class:`LocalExecutor` on ``devices`` (CUDA
    devices; empty: every visible one) with ``cpu_slots`` CPU slots (None: its default)."""
    from kerneljudge.executors.local import LocalExecutor

    return LocalExecutor(devices=list(devices) or None, cpu_slots=cpu_slots)


def serve_command(
    host: Annotated[str, typer.Option(envvar="KERNELJUDGE_HOST", help="Address to bind.")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(envvar="KERNELJUDGE_PORT", min=0, max=65535)] = 8765,
    db: Annotated[
        Path, typer.Option(envvar="KERNELJUDGE_DB", help="The job database (SQLite file).")
    ] = Path("kerneljudge-jobs.sqlite"),
    token: Annotated[
        Optional[str],
        typer.Option(
            envvar="KERNELJUDGE_TOKEN",
            help="API token clients send as 'Authorization: Bearer'; required off loopback.",
        ),
    ] = None,
    max_queued: Annotated[
        int, typer.Option(envvar="KERNELJUDGE_MAX_QUEUED", min=1, help="Queue size (then 429).")
    ] = 10_000,
    max_per_client: Annotated[
        int, typer.Option(envvar="KERNELJUDGE_MAX_PER_CLIENT", min=1, help="Queued per client.")
    ] = 5_000,
    max_batch: Annotated[int, typer.Option(envvar="KERNELJUDGE_MAX_BATCH", min=1)] = 256,
    problems_dir: Annotated[
        Optional[Path],
        typer.Option(
            envvar="KERNELJUDGE_PROBLEMS_DIR", help="Folder of problem files jobs may name."
        ),
    ] = None,
    cpu_slots: Annotated[
        Optional[int],
        typer.Option(
            envvar="KERNELJUDGE_CPU_SLOTS", min=0, help="CPU judging slots (default: by cores)."
        ),
    ] = None,
    devices: Annotated[
        Optional[str],
        typer.Option(
            envvar="KERNELJUDGE_DEVICES", help="Comma list of cuda:N (default: every GPU)."
        ),
    ] = None,
    max_in_flight: Annotated[
        int,
        typer.Option(
            envvar="KERNELJUDGE_MAX_IN_FLIGHT",
            min=0,
            help="Jobs handed to the executor at once (0: two per slot).",
        ),
    ] = 0,
    retention_hours: Annotated[
        float,
        typer.Option(
            envvar="KERNELJUDGE_RETENTION_HOURS",
            min=0.0001,
            help="Hours a finished job's result is kept.",
        ),
    ] = 168.0,
    max_finished_jobs: Annotated[
        int,
        typer.Option(
            envvar="KERNELJUDGE_MAX_FINISHED_JOBS",
            min=1,
            help="Finished jobs kept at most (fetched ones, oldest deleted first).",
        ),
    ] = 100_000,
) -> None:
    """Serve the judge over HTTP: a durable job queue (SQLite) in front of this machine's
    devices. Candidates are code: off loopback a --token is required."""
    from kerneljudge.cli.app import _fail

    if not is_loopback(host) and not token:
        _fail(f"refusing to listen on {host} without an API token (--token or KERNELJUDGE_TOKEN)")
    if token and not (token.isascii() and token.isprintable()):
        _fail("the API token must be printable ASCII (clients send it in an HTTP header)")
    if problems_dir is not None and not problems_dir.is_dir():
        _fail(f"--problems-dir {problems_dir} is not a folder")
    try:
        import uvicorn

        from kerneljudge.service.app import create_app
        from kerneljudge.service.core import JudgeService, Limits
        from kerneljudge.service.store import JobStore
    except ImportError:
        _fail(MISSING_SERVE)
        return
    wanted = tuple(d.strip() for d in (devices or "").split(",") if d.strip())
    try:
        store = JobStore(db)
    except Exception as exc:
        _fail(f"cannot open the job database {db}: {' '.join(str(exc).split())}")
        return
    limits = Limits(
        max_queued=max_queued,
        max_per_client=max_per_client,
        max_batch=max_batch,
        retention_s=retention_hours * 3600.0,
        max_finished_jobs=max_finished_jobs,
    )
    service = JudgeService(
        store,
        lambda: build_executor(cpu_slots, wanted),
        limits=limits,
        problems_dir=problems_dir,
        max_in_flight=max_in_flight,
    )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    app = create_app(service, token=token)
    # Open connections (a client waiting for a result) get this long after a stop is asked.
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", lifespan="off", timeout_graceful_shutdown=5
    )

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:  # SIGTERM, SIGINT while serving
            service.stop_dispatching()  # no job starts after the signal
            super().handle_exit(sig, frame)

    server = Server(config)
    try:  # the port first: a port in use costs no executor start
        sock = socket.create_server(
            (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET
        )
    except OSError as exc:
        store.close()
        _fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
        return
    try:
        service.start()
    except Exception as exc:
        sock.close()
        store.close()
        _fail(f"cannot start the executor: {' '.join(str(exc).split())}")
        return
    # uvicorn raises the signals it caught again once it stopped: this one must not kill the
    # process before the clean-up below.
    previous = signal.signal(signal.SIGTERM, lambda *_: setattr(server, "should_exit", True))
    from kerneljudge.service.discovery import remove_record, write_record

    bound = int(sock.getsockname()[1])
    print(f"kerneljudge serve: http://{host}:{bound} (pid {os.getpid()})", flush=True)
    # Where `kerneljudge eval` finds this service (removed at a clean exit; a record left by a
    # crash names a dead process and is ignored).
    record = write_record(host, bound, bool(token), problems_dir)
    try:
        server.run(sockets=[sock])
    finally:
        # The clean-up runs to its end: another SIGTERM or Ctrl-C now would leave jobs
        # "running", counted as a crash's at the next start.
        previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            remove_record(record)
            service.close()
            store.close()
        finally:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGINT, previous_int)


def remote_eval(
    server: str,
    token: str | None,
    problem: str,
    cand: Candidate,
    config: JudgeConfig,
    shape_sets: str,
    unsupported: dict[str, object],
    wait_s: float = 3600.0,
    local_problem: str | None = None,
) -> Verdict:
    """``kerneljudge eval --server``: judge ``cand`` on ``problem`` through the service at
    ``server`` with the options of ``config`` (those a job carries: JudgeOptions), and wait up
    to ``wait_s`` seconds for the verdict. ``shape_sets`` ``all`` needs the problem here too
    (to list its sets), read from ``local_problem`` when given (the problem as this machine
    names it); ``unsupported`` maps an eval option a job cannot carry to its value.

    Raises:
        KernelJudgeError: an option a job cannot carry is set; the service refused the job,
            gave it no verdict (its JobError) or none in ``wait_s`` seconds (one line).
    """
    from kerneljudge.errors import KernelJudgeError
    from kerneljudge.executors.base import Job
    from kerneljudge.judge.options import JudgeOptions

    for flag, value in unsupported.items():
        if value is not None:
            raise KernelJudgeError(f"{flag} is not available with --server")
    sets = config.shape_sets
    if shape_sets == "all":
        from kerneljudge.problem import Problem

        sets = tuple(Problem.load(local_problem or problem).shape_sets) or sets
    options = JudgeOptions(
        device=config.device,
        trials=config.trials,
        tolerance=config.tolerance,
        timing=config.timing,
        baselines=tuple(config.baselines),
        graph_timing=config.graph_timing,
        shape_sets=tuple(sets),
        max_time_s=config.timing_config.max_time_s if config.timing_config else None,
        build_timeout_s=config.build_timeout_s,
        run_timeout_s=config.run_timeout_s,
    )
    job = Job(problem=problem, source=cand.source, options=options, name=cand.name)
    try:
        from kerneljudge.service.client import JudgeClient, ServiceError
    except ImportError:
        raise KernelJudgeError(MISSING_SERVE) from None
    try:
        with JudgeClient(server, token=token) as client:
            client.submit(job)
            return client.result(job.job_id, wait=wait_s)
    except ServiceError as exc:
        raise KernelJudgeError(str(exc)) from None
    except TimeoutError as exc:
        raise KernelJudgeError(str(exc)) from None


def local_service_eval(
    problem: str,
    cand: Candidate,
    config: JudgeConfig,
    shape_sets: str,
    unsupported: dict[str, object],
    token: str | None,
    note: Callable[[str], None],
) -> Verdict | None:
    """``kerneljudge eval`` without ``--server``: the verdict of the loopback service that the
    discovery file names (:mod:`kerneljudge.service.discovery`), or None when there is none
    that can judge this request: no live service answering its health check quickly, an
    option a job cannot carry (``unsupported``, as :func:`remote_eval`), a service that wants
    a token and none given, a problem it cannot load (neither bundled nor under its
    ``--problems-dir``), or any failure to get the verdict from it. ``note`` is called with one
    line when a found service is used or passed over, and when it fails. Never raises."""
    from kerneljudge.errors import KernelJudgeError
    from kerneljudge.service.discovery import find_local_service, service_problem

    found = find_local_service()
    if found is None:
        return None
    where = f"the local service at {found.url}"
    carried = [flag for flag, value in unsupported.items() if value is not None]
    if carried:
        note(f"judging in this process: {carried[0]} is not carried to {where}")
        return None
    if found.token_required and not token:
        note(f"judging in this process: {where} needs a token (KERNELJUDGE_TOKEN or --token)")
        return None
    named = service_problem(problem, found.problems_dir)
    if named is None:
        note(f"judging in this process: {where} cannot load {problem} (not under its folder)")
        return None
    ahead = f", {found.queue_depth} jobs queued there" if found.queue_depth else ""
    note(f"judging through {where} (pid {found.pid}{ahead}); --local judges in this process")
    try:
        return remote_eval(
            found.url,
            token if found.token_required else None,
            named,
            cand,
            config,
            shape_sets,
            {},
            local_problem=problem,
        )
    except KernelJudgeError as exc:
        reason = " ".join(str(exc).split())
    except Exception as exc:  # noqa: BLE001 - any failure of the service path: judge here
        reason = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    note(f"{where} failed ({reason[:300]}): judging in this process")
    return None
