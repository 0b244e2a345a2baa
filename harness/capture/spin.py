"""Delays queued on a stream as PyTorch's spin kernel, for every source that launches through
PyTorch's streams (PyTorch's ops, Triton's kernels, CUDA graph replays).

``torch.cuda._sleep(cycles)`` spins one thread for a number of GPU clock cycles, so a delay of
some microseconds is that many microseconds of cycles at the rate the spin runs on that
device, measured once per device and process (:func:`queue` says the rate in a note). The
measurement runs on a stream of its own, so the program's queued work is not waited for, and
unwatched: every source that registered a switch (:func:`while_calibrating`) is off meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.capture.amplify import Amplifier, Delay

_rates: dict[int, float] = {}  # device index -> clock cycles a microsecond of the spin
_said: set[int] = set()  # devices whose rate the run's notes have
_switches: list[Callable[[bool], None]] = []  # each watching source's on/off


def while_calibrating(switch: Callable[[bool], None]) -> Callable[[], None]:
    """Have ``switch(False)`` called while the spin is measured, ``switch(True)`` after;
    returns what takes the switch back out."""
    _switches.append(switch)
    return lambda: _switches.remove(switch) if switch in _switches else None


def queue(torch: Any, amplifier: Amplifier, emit: Callable[[list[Any]], None], delay: Delay,
          index: int, sid: int) -> None:
    """Queue ``delay`` on the current stream of device ``index`` (stream ``sid``); a delay
    that cannot be queued is the amplifier's to say, never the program's failure."""
    try:
        rate = ready(torch, index)
        if index not in _said:  # once a device, whenever it was measured
            _said.add(index)
            emit(["note", f"delays: the spin kernel counts {rate:.0f} clock cycles a "
                          f"microsecond on cuda:{index} (measured)"])
        with torch.cuda.device(index):
            torch.cuda._sleep(max(1, int(delay.us * rate)))
    except Exception as exc:
        amplifier.failed(delay, repr(exc))
        return
    amplifier.queued(delay, sid)


def ready(torch: Any, index: int) -> float:
    """The spin's clock cycles a microsecond on device ``index``, measured at the first ask
    (before a CUDA graph's capture that may hold a delay: it synchronizes)."""
    rate = _rates.get(index)
    if rate is None:
        rate = _rates[index] = _calibrate(torch, index)
    return rate


def _calibrate(torch: Any, index: int) -> float:
    """Clock cycles a microsecond of the spin: the fastest of three rounds (a round the
    program's kernels held back reads slow)."""
    for switch in _switches:
        switch(False)
    try:
        with torch.cuda.device(index):
            stream = torch.cuda.Stream()
            best = 0.0
            with torch.cuda.stream(stream):
                for cycles in (100_000, 1_000_000, 1_000_000):
                    begin = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    begin.record(stream)
                    torch.cuda._sleep(cycles)
                    end.record(stream)
                    end.synchronize()
                    us = begin.elapsed_time(end) * 1000.0
                    if us > 0:
                        best = max(best, cycles / us)
    finally:
        for switch in _switches:
            switch(True)
    if best <= 0:
        raise RuntimeError("the spin kernel took no measurable time")
    return best
