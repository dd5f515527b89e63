"""The one handler of stop signals (:mod:`kerneljudge.stopping`): each signal's exception and
exit status, a stop that a finalizer swallowed raised again, :meth:`StopSignals.hold`
deferring a stop (nested too), ignored signals left alone, the previous handlers put back."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kerneljudge.errors import Terminated
from kerneljudge.stopping import STOP_SIGNALS, StopSignals, exit_status, signal_of

# A KeyboardInterrupt dropped inside a finalizer is reported by Python as unraisable: the point.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def _send(stop: StopSignals, signum: int) -> None:
    """Send ``signum`` to this process and wait until ``stop`` has recorded it (its handler
    raises in this wait unless a hold lasts)."""
    os.kill(os.getpid(), signum)
    deadline = time.monotonic() + 10  # a liveness bound, not a speed check
    while stop.requested is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stop.requested is not None, "the handler did not run"


class _SignalsInFinalizer:
    def __init__(self, signum: int) -> None:
        self.signum = signum

    def __del__(self) -> None:
        os.kill(os.getpid(), self.signum)
        time.sleep(0.05)  # the handler runs here, inside __del__: its exception is dropped


@pytest.fixture
def handlers() -> Iterator[dict[int, Any]]:
    """The stop signals' handlers before the test; put back after it."""
    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    yield before
    for signum, handler in before.items():
        signal.signal(signum, handler)


@pytest.mark.parametrize(
    ("signum", "status"),
    [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)],
    ids=["sigint", "sigterm", "sighup"],
)
def test_each_stop_signal_raises_its_interrupt(
    signum: int, status: int, handlers: dict[int, Any]
) -> None:
    with pytest.raises(KeyboardInterrupt) as info, StopSignals() as stop:
        _send(stop, signum)
    assert stop.requested == signum
    assert isinstance(info.value, Terminated) == (signum != signal.SIGINT)
    assert signal_of(info.value) == signum and exit_status(info.value) == status


def test_a_stop_swallowed_by_a_finalizer_is_raised_again_at_the_next_check(
    handlers: dict[int, Any],
) -> None:
    reached = False
    with pytest.raises(Terminated) as info, StopSignals() as stop:
        _SignalsInFinalizer(signal.SIGTERM)  # made and collected at once
        reached = True  # the handler's Terminated was dropped...
        stop.check()  # ...but remembered
    assert reached and info.value.signum == signal.SIGTERM


def test_a_swallowed_stop_is_raised_when_the_block_ends(handlers: dict[int, Any]) -> None:
    with pytest.raises(Terminated), StopSignals():
        _SignalsInFinalizer(signal.SIGHUP)


def test_hold_defers_the_stop_and_raises_it_at_its_end(handlers: dict[int, Any]) -> None:
    steps = []
    with pytest.raises(Terminated), StopSignals() as stop:  # and again when the block ends
        with pytest.raises(Terminated) as info, stop.hold():
            _send(stop, signal.SIGTERM)
            stop.check()  # deferred as well
            steps.append("clean-up ran to its end")
        steps.append("raised at the hold's end")
    assert steps == ["clean-up ran to its end", "raised at the hold's end"]
    assert info.value.signum == signal.SIGTERM


def test_only_the_outermost_hold_raises(handlers: dict[int, Any]) -> None:
    steps = []
    with pytest.raises(Terminated) as info, StopSignals() as stop:
        with stop.hold():
            with stop.hold():
                _send(stop, signal.SIGHUP)
            steps.append("inner hold ended")
        steps.append("not reached")
    assert steps == ["inner hold ended"] and info.value.signum == signal.SIGHUP


def test_a_hold_does_not_raise_again_a_stop_that_came_before_it(
    handlers: dict[int, Any],
) -> None:
    steps = []
    with pytest.raises(KeyboardInterrupt), StopSignals() as stop:  # the block's end checks
        try:
            _send(stop, signal.SIGINT)
        except KeyboardInterrupt:
            with stop.hold():  # the clean-up of the stop being handled
                os.kill(os.getpid(), signal.SIGTERM)  # a second one, while it runs
                time.sleep(0.2)  # its handler runs here
            steps.append("the hold ended quietly")
    assert steps == ["the hold ended quietly"] and stop.requested == signal.SIGINT


def test_the_previous_handlers_come_back(handlers: dict[int, Any]) -> None:
    def mine(signum: int, frame: Any) -> None:
        pass

    for signum in STOP_SIGNALS:
        signal.signal(signum, mine)
    with StopSignals() as stop:
        assert all(signal.getsignal(s) == stop._handle for s in STOP_SIGNALS)
    assert all(signal.getsignal(s) is mine for s in STOP_SIGNALS)
    with pytest.raises(ValueError), StopSignals():
        raise ValueError("the block failed")
    assert all(signal.getsignal(s) is mine for s in STOP_SIGNALS)


def test_an_ignored_sighup_stays_ignored(handlers: dict[int, Any]) -> None:
    """``nohup``: SIGHUP is left ignored; an ignored SIGINT (a background job) is taken, unless
    the caller keeps it (as the console script does)."""
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    with StopSignals() as stop:
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) == stop._handle
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(0.2)
    assert stop.requested is None
    with StopSignals(keep_ignored=STOP_SIGNALS):
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGHUP) is signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_outside_the_main_thread_it_sets_no_handler(handlers: dict[int, Any]) -> None:
    seen: list[object] = []

    def block() -> None:
        with StopSignals() as stop, stop.hold():
            seen.extend(signal.getsignal(s) for s in STOP_SIGNALS)
            stop.check()

    thread = threading.Thread(target=block)
    thread.start()
    thread.join()
    assert seen == list(handlers.values())


def test_an_inner_blocks_signal_is_recorded_in_the_outer_one(handlers: dict[int, Any]) -> None:
    """Only the inner block raises, but the outer one knows which signal stopped the command
    (the console script's exit status comes from it)."""
    with StopSignals() as outer:
        with pytest.raises(Terminated), StopSignals() as inner:
            _send(inner, signal.SIGHUP)
        assert outer.requested == signal.SIGHUP
        outer.requested = None  # handled here: the outer block ends without raising


def _swallowed() -> None:
    _SignalsInFinalizer(signal.SIGTERM)  # dropped at once: its finalizer sends the signal


def _inner_hold() -> None:
    with StopSignals() as inner, inner.hold():
        _send(inner, signal.SIGHUP)  # raised as Terminated when the hold ends: not caught


@pytest.mark.parametrize(
    ("command", "status"),
    [(_swallowed, 143), (_inner_hold, 129)],
    ids=["swallowed-by-a-finalizer", "taken-by-an-inner-block"],
)
def test_the_console_script_exits_with_the_signals_status(
    command: Any, status: int, handlers: dict[int, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command that went on after a finalizer swallowed its SIGTERM, and one stopped by a
    signal that an inner block took (typer turns that interrupt into status 130), exit with
    the signal's status, not 0 or 130."""
    import typer

    from kerneljudge.cli import app as cli

    demo = typer.Typer()
    demo.command()(command)
    monkeypatch.setattr(cli, "app", demo)
    monkeypatch.setattr("sys.argv", ["kerneljudge"])
    with pytest.raises(SystemExit) as info:
        cli.main()
    assert info.value.code == status
