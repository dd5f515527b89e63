"""A Ctrl-C during a suite run is never lost, even when Python drops its KeyboardInterrupt
(raised while a finalizer runs)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from kerneljudge.stopping import StopSignals

# The dropped KeyboardInterrupt is reported by Python as unraisable, which is the point here.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


class _SignalsInFinalizer:
    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler runs here, inside __del__: its exception is dropped


def test_python_drops_a_keyboard_interrupt_raised_in_a_finalizer() -> None:
    reached = False
    _SignalsInFinalizer()  # made and collected at once
    reached = True
    assert reached  # the plain handler's KeyboardInterrupt did not stop this code


def test_a_lost_ctrl_c_is_raised_again_at_the_next_check() -> None:
    reached = False
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN when started as a background job
    with pytest.raises(KeyboardInterrupt), StopSignals() as ctrl_c:
        _SignalsInFinalizer()
        reached = True  # dropped here as well...
        ctrl_c.check()  # ...but remembered
    assert reached and ctrl_c.requested
    assert signal.getsignal(signal.SIGINT) == before  # restored


def test_a_lost_ctrl_c_after_the_last_check_is_raised_when_the_block_ends() -> None:
    with pytest.raises(KeyboardInterrupt), StopSignals():
        _SignalsInFinalizer()


def test_sigterm_raises_terminated_and_the_handlers_are_put_back() -> None:
    from kerneljudge.errors import Terminated

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(Terminated), StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)  # the handler raises here; the sleep is only a bound
    assert stop.requested == signal.SIGTERM and issubclass(Terminated, KeyboardInterrupt)
    assert {s: signal.getsignal(s) for s in before} == before
