"""Runs of many episodes: planned, recorded as they go, resumable, and cleaned up after.

:func:`run_episodes` writes the run's plan into its output folder before the first episode
starts and records every episode's state as it goes (:mod:`kerneljudge.agent.runlog`): a
``kill -9`` at any moment leaves a true record. :func:`resume_episodes` continues such a run:
episodes with a summary line are not run again; an episode that had started is run again from
the start (its old transcript is kept as ``<episode id>.interrupted.jsonl``, marked); planned
ones run. Every episode ends with exactly one line in ``summary.jsonl``, also one that fails
(``state`` ``failed``, its ``error`` says why: the model server unreachable or failing, a
harness error).

Concurrency: episodes run in ``concurrency`` threads. Judges (each with its worker processes)
are kept in a pool (:class:`JudgePool`) and lent to an episode for one step at a time (creating
its environment, one tool call, the end of a turn), so their workers start once per judge, not
once per episode, and an episode waiting for its model holds none. At most ``judges`` judges
are alive at a time (default: ``min(concurrency, 2)``); a step waits for one. A judge serves
one step at a time (it is not thread-safe), and every judge holds the same device lock around
anything that runs a candidate, so timings never overlap.

Remote judging: with ``server`` (a ``kerneljudge serve`` address) every episode judges through
that service (:class:`~kerneljudge.env.remote.RemoteJudge`, one per episode) and no judge runs
here; the service queues the episodes' jobs and times one candidate per device at a time. The
plan records the address (not the token), and a resumed run uses it unless told another.

Signals: SIGINT (Ctrl-C), SIGTERM and SIGHUP stop a run at once
(:class:`~kerneljudge.stopping.StopSignals`); the episodes in flight are marked
``interrupted`` (as a resumed run marks those a dead run left) and not waited for, and the run
raises :class:`~kerneljudge.agent.interrupt.RunInterrupted` once it has cleaned up (see
:mod:`kerneljudge.agent.interrupt`).

Temporary files: while a run lasts, the process's temporary folder (:data:`tempfile.tempdir`)
is the run's own folder (``kj-run-*`` under the system's), recorded in ``state.jsonl``; the
workers' scratch folders go there. The run removes it at its end; a resumed run removes those of
the runs it continues (and ends any process still working in them).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kerneljudge.agent.config import RunnerConfig
from kerneljudge.agent.interrupt import Cancelled, Flight, RunInterrupted
from kerneljudge.agent.runlog import RunLog, cleanup_tmp, read_jsonl, repair_tail
from kerneljudge.agent.runner import ChatClient, Progress, run_episode
from kerneljudge.agent.transcript import EpisodeSummary, TranscriptWriter
from kerneljudge.env import EnvConfig
from kerneljudge.env._context import JudgeSession
from kerneljudge.env.remote import RemoteJudge
from kerneljudge.env.rewards import RewardFn
from kerneljudge.judge import Judge
from kerneljudge.problem import Problem, resolve_problem
from kerneljudge.stopping import StopSignals, signal_of

__all__ = ["JudgePool", "resume_episodes", "run_episodes"]

#: Judges alive at once by default (at most ``concurrency``): one judging on the device while
#: another builds or prepares; the device lock makes more of them wait anyway.
DEFAULT_JUDGES = 2
#: Stop reasons whose episode counts as ``failed`` in ``summary.jsonl``.
FAILED_STOPS = frozenset({"error", "server_unreachable", "model_error"})


class JudgePool:
    """Judges handed from episode to episode; at most ``limit`` alive at once.

    Args:
        env_config: the configuration every judge is made for (as an environment makes it).
        limit: the most judges alive at once (across problems).
        device_lock: the lock every judge holds around candidate runs.
    """

    def __init__(self, env_config: EnvConfig, limit: int, device_lock: Any) -> None:
        self.env_config = env_config
        self.limit = max(1, limit)
        self.device_lock = device_lock
        self._idle: dict[str, list[JudgeSession]] = {}
        self._alive = 0
        self._cond = threading.Condition()
        self._closed = False
        self.created = 0

    @contextlib.contextmanager
    def judge(self, problem: str) -> Iterator[Judge]:
        """A judge of ``problem`` for the block; it goes back to the pool afterwards, or is
        closed when the block raised (its workers may be in any state)."""
        session = self._take(problem)
        ok = False
        try:
            yield session.judge
            ok = True
        finally:
            with self._cond:
                if ok:
                    self._idle.setdefault(problem, []).append(session)
                else:
                    self._alive -= 1
                self._cond.notify_all()
            if not ok:
                session.close()

    def _take(self, problem: str) -> JudgeSession:
        evict: JudgeSession | None = None
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("the run's judges were closed")
                idle = self._idle.get(problem)
                if idle:
                    return idle.pop()
                if self._alive < self.limit:
                    self._alive += 1
                    break
                other = next((p for p, v in self._idle.items() if v), None)
                if other is not None:  # an idle judge of another problem makes room
                    evict = self._idle[other].pop()
                    break
                self._cond.wait()
        if evict is not None:
            evict.close()
        try:
            session = JudgeSession(Problem.load(problem), self.env_config, None, self.device_lock)
        except BaseException:
            with self._cond:
                self._alive -= 1
                self._cond.notify_all()
            raise
        self.created += 1
        return session

    def close(self) -> None:
        """Close every idle judge (all of them, once the episodes have ended); a step that
        asks for a judge afterwards gets a RuntimeError."""
        with self._cond:
            self._closed = True
            sessions = [s for v in self._idle.values() for s in v]
            self._idle.clear()
            self._alive -= len(sessions)
            self._cond.notify_all()
        for session in sessions:
            session.close()


def run_episodes(
    problems: list[str],
    runner: RunnerConfig,
    env_config: EnvConfig | None = None,
    *,
    episodes: int = 1,
    concurrency: int = 1,
    out_dir: Path | str,
    client: ChatClient | None = None,
    reward: RewardFn | None = None,
    progress: Progress | None = None,
    judges: int = 0,
    server: str | None = None,
    token: str | None = None,
) -> list[EpisodeSummary]:
    """Run ``episodes`` episodes of every problem, ``concurrency`` at a time, recorded in
    ``out_dir`` (see the module docstring).

    Args:
        judges: the most judges alive at once (0: ``min(concurrency, 2)``).
        server: judge through the judge service at this address (None: judges here); each
            problem is named to it as given.
        token: the service's API token.

    Returns:
        The summaries, in plan order (an episode that failed has ``stop_reason`` ``error``,
        ``server_unreachable`` or ``model_error`` and its ``error``).

    Raises:
        ProblemError: a problem names no bundled problem and no file (before any episode).
        ServerUnreachable: the server could not be reached; that episode has its ``failed``
            summary, episodes not yet started stay planned (resume the run later).
        MissingExtraError: ``client`` is None and the ``openai`` package is missing.
        RuntimeError: another live process runs in ``out_dir``, or it holds a run with
            episodes not ended (resume that one, see :func:`resume_episodes`).
        RunInterrupted: SIGINT, SIGTERM or SIGHUP came while the episodes ran (in the main
            thread): those in flight were marked ``interrupted`` and not waited for.
        KeyboardInterrupt: one came once every episode had ended, during the run's clean-up
            (:class:`~kerneljudge.errors.Terminated` for SIGTERM and SIGHUP); raised after it.
        ValueError: ``episodes``, ``concurrency`` or ``judges`` out of range, or no problem.
    """
    if episodes < 1 or concurrency < 1 or judges < 0:
        raise ValueError("episodes and concurrency must be at least 1, judges at least 0")
    if not problems:
        raise ValueError("no problem to run: name at least one")
    for problem in problems:
        resolve_problem(problem)  # a misspelt name fails here, not in every episode
    config = env_config or EnvConfig()
    jobs = [(p, i) for p in problems for i in range(episodes)]
    run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]
    plan = {
        "run_id": run_id,
        "problems": list(problems),
        "episodes": episodes,
        "slots": [
            {"slot": f"{run_id}/{k:04d}", "problem": p, "index": i} for k, (p, i) in enumerate(jobs)
        ],
        "env_config": config.to_dict(),
        "runner": runner.public_dict(),
        "concurrency": concurrency,
    }
    if server:
        plan["server"] = server
    log = RunLog(out_dir)
    log.lock()
    try:
        if log.plan_path.exists():
            left = [st for st in log.states() if st.summary is None]
            if left:
                raise RuntimeError(
                    f"{log.out} holds an unfinished run ({len(left)} episodes not ended): "
                    f"continue it with --resume {log.out}, or choose another --out"
                )
        log.repair()
        log.write_plan(plan)
        remote = (server, token) if server else None
        return _execute(log, runner, config, concurrency, client, reward, progress, judges, remote)
    finally:
        log.unlock()


def resume_episodes(
    out_dir: Path | str,
    runner: RunnerConfig,
    *,
    concurrency: int | None = None,
    client: ChatClient | None = None,
    reward: RewardFn | None = None,
    progress: Progress | None = None,
    judges: int = 0,
    server: str | None = None,
    token: str | None = None,
) -> list[EpisodeSummary]:
    """Continue the run recorded in ``out_dir`` with its own environment configuration (and
    its judge service, unless ``server`` names another; ``token`` is the service's), and its
    own concurrency unless ``concurrency`` is given (1 for a plan that records none).

    Removes what the runs it continues left behind (temporary folders, processes working in
    them); recovers an episode whose summary reached its transcript only; marks the transcript
    of an episode that had started as interrupted and runs the episode again; runs the
    planned ones.

    Returns:
        The summaries of every episode of the plan, in plan order.

    Raises:
        FileNotFoundError: ``out_dir`` holds no run.
        RuntimeError: another live process runs in ``out_dir``.
        ServerUnreachable, MissingExtraError, ValueError, RunInterrupted, KeyboardInterrupt: as
            :func:`run_episodes`.
    """
    log = RunLog(out_dir, create=False)
    plan = log.plan()
    if concurrency is None:
        recorded = plan.get("concurrency")
        concurrency = recorded if isinstance(recorded, int) and recorded >= 1 else 1
    if concurrency < 1 or judges < 0:
        raise ValueError("concurrency must be at least 1, judges at least 0")
    config = EnvConfig.from_dict(plan["env_config"])
    log.lock()
    try:
        log.repair()
        for record in log.run_records():  # every earlier runner is dead: we hold the lock
            if record.get("tmp"):
                cleanup_tmp(record["tmp"])
        _reconcile(log, progress)
        server = server or plan.get("server")
        remote = (str(server), token) if server else None
        return _execute(log, runner, config, concurrency, client, reward, progress, judges, remote)
    finally:
        log.unlock()


def _reconcile(log: RunLog, progress: Progress | None) -> None:
    """Settle the slots a dead run left started: recover or mark them interrupted."""
    say = progress or (lambda line: None)
    for st in log.states():
        if st.state not in ("started", "partial"):
            continue
        path = Path(st.transcript) if st.transcript else None
        if path is not None and path.exists():
            records = read_jsonl(path)
            if records and records[-1].get("type") == "summary":
                summary = EpisodeSummary.from_dict(records[-1])
                log.event(st.slot, "recovered", episode_id=st.episode_id)
                log.add_summary(st.slot, summary.to_dict(), _state_of(summary))
                say(f"[{st.slot}] recovered the summary of {st.episode_id} from its transcript")
                continue
            repair_tail(path)
            with open(path, "a", encoding="utf-8") as f:
                note = "the run ended before this episode did; it was run again from the start"
                f.write(f'{{"type": "interrupted", "steps": {st.steps}, "reason": "{note}"}}\n')
            moved = path.with_name(path.stem + ".interrupted.jsonl")
            path.replace(moved)
            path = moved
        moved_to = log.relative(path) if path is not None else ""
        log.event(st.slot, "interrupted", transcript=moved_to, steps=st.steps)
        say(f"[{st.slot}] {st.episode_id or 'episode'} was interrupted after {st.steps} steps")


def _state_of(summary: EpisodeSummary) -> str:
    return "failed" if summary.stop_reason in FAILED_STOPS else "finished"


def _execute(
    log: RunLog,
    runner: RunnerConfig,
    config: EnvConfig,
    concurrency: int,
    client: ChatClient | None,
    reward: RewardFn | None,
    progress: Progress | None,
    judges: int,
    remote: tuple[str, str | None] | None = None,
) -> list[EpisodeSummary]:
    """Run the plan's episodes not ended; ``remote``: ``(server, token)`` of a judge service.

    Raises:
        RunInterrupted: SIGINT, SIGTERM or SIGHUP came (in the main thread): the episodes in
            flight were marked ``interrupted`` and not waited for (see
            :mod:`kerneljudge.agent.interrupt`).
        KeyboardInterrupt: one came during the clean-up after every episode had ended
            (:class:`~kerneljudge.errors.Terminated` for SIGTERM and SIGHUP); raised after it.
    """
    from kerneljudge.agent.client import ServerUnreachable

    if client is None:
        from kerneljudge.agent.client import ModelClient

        client = ModelClient(runner)
    plan = log.plan()
    index = {s["slot"]: s for s in plan["slots"]}
    todo = [st.slot for st in log.states() if st.summary is None]
    stop = threading.Event()
    unreachable: list[ServerUnreachable] = []
    device_lock = threading.Lock()
    pool = JudgePool(config, judges or min(concurrency, DEFAULT_JUDGES), device_lock)
    flight = Flight(log)

    def job(slot: str) -> None:
        problem, n = str(index[slot]["problem"]), int(index[slot]["index"])
        writer: list[TranscriptWriter] = []

        def hook(event: str, fields: dict[str, Any]) -> None:
            if "transcript" in fields:  # relative to the run folder: valid from any cwd
                fields = {**fields, "transcript": log.relative(fields["transcript"])}
            flight.record(slot, event, fields, writer[0] if writer else None)

        remote_judge = None
        try:
            if remote is not None:  # this episode's own client of the service
                remote_judge = RemoteJudge(problem, remote[0], remote[1])
            summary = run_episode(
                problem,
                runner,
                config,
                out_dir=log.out,
                client=client,
                judge=remote_judge,  # type: ignore[arg-type]  # a Judge's stand-in
                lease=None if remote_judge is not None else lambda: pool.judge(problem),
                device_lock=device_lock,
                reward=reward,
                progress=lambda line: flight.say(line, progress),
                on_event=hook,
                on_transcript=writer.append,
            )
        except Exception as exc:  # noqa: BLE001 - every failure is this episode's summary
            if flight.cancelled:
                return
            if isinstance(exc, ServerUnreachable):
                stop.set()
                unreachable.append(exc)
            summary = getattr(exc, "summary", None) or _failure(problem, n, runner, exc)
        finally:
            if remote_judge is not None:
                remote_judge.close()
        with contextlib.suppress(Cancelled):
            flight.end(slot, summary.to_dict(), _state_of(summary))

    saved = tempfile.tempdir
    tmp = Path(tempfile.gettempdir()) / f"kj-run-{uuid.uuid4().hex[:12]}"

    def clean_up() -> None:
        pool.close()
        tempfile.tempdir = saved
        cleanup_tmp(tmp)  # also ends the workers of judges still lent to episodes
        shutil.rmtree(tmp, ignore_errors=True)
        log.event_many([{"event": "run_end", "pid": os.getpid(), "judges_created": pool.created}])

    cleaned: list[bool] = []

    def clean_up_once() -> None:
        if not cleaned:
            cleaned.append(True)
            clean_up()

    with StopSignals() as signals:
        try:
            tmp.mkdir(mode=0o700)
            record = {"pid": os.getpid(), "tmp": str(tmp), "todo": len(todo)}
            log.event_many([{"event": "run", **record, "concurrency": concurrency}])
            tempfile.tempdir = str(tmp)
            _run_jobs(todo, job, concurrency, stop.is_set, signals.check)
        except BaseException as exc:  # a signal: the episodes in flight are not waited for
            signum = signal_of(exc)
            with signals.hold():  # the clean-up runs to its end
                try:
                    flight.interrupt(
                        f"the run was stopped ({signal.Signals(signum).name}) before this "
                        "episode ended; a resumed run runs it again from the start"
                    )
                finally:
                    clean_up_once()
            if not isinstance(exc, KeyboardInterrupt):
                raise
            raise RunInterrupted(signum, log.out) from exc
        finally:  # also where a second signal came before the hold above
            with signals.hold():
                clean_up_once()
    if unreachable:
        raise unreachable[0]
    done = log.summaries()
    return [EpisodeSummary.from_dict(done[s["slot"]]) for s in plan["slots"] if s["slot"] in done]


def _run_jobs(
    slots: list[str],
    job: Callable[[str], None],
    concurrency: int,
    stop: Callable[[], bool],
    check: Callable[[], None],
) -> None:
    """Run ``job(slot)`` for every slot in ``concurrency`` daemon threads (a thread takes no
    new slot once ``stop()``); the main thread waits for them, calling ``check()`` twice a
    second, and a signal's exception raised there (or by ``check``) leaves them running. An
    exception that escapes a job is raised here."""
    pending = list(reversed(slots))
    lock = threading.Lock()
    failures: list[BaseException] = []

    def work() -> None:
        while True:
            with lock:
                if not pending or stop() or failures:
                    return
                slot = pending.pop()
            try:
                job(slot)
            except BaseException as exc:  # noqa: BLE001 - passed on to the main thread
                failures.append(exc)
                return

    threads = [
        threading.Thread(target=work, name=f"kj-episode-{k}", daemon=True)
        for k in range(min(concurrency, len(slots)))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            check()  # a stop whose exception a finalizer swallowed
            thread.join(0.5)
    if failures:
        raise failures[0]


def _failure(problem: str, index: int, runner: RunnerConfig, exc: BaseException) -> EpisodeSummary:
    """The summary of an episode that ended before it had an environment."""
    return EpisodeSummary(
        episode_id=f"{problem}-{index}",
        problem=str(problem),
        model=runner.model,
        status="none",
        reward=None,
        speedup_eager=None,
        speedup_compile=None,
        submitted_by="",
        stop_reason="error",
        tool_calls=0,
        turns=0,
        prompt_tokens=0,
        completion_tokens=0,
        duration_s=0.0,
        error=str(exc) or type(exc).__name__,
    )
