"""Capture: the user's own program as a source of the op log.

A watched program runs in a process of its own with one or more *sources* switched on
(:mod:`harness.capture.torch_source` for PyTorch, :mod:`harness.capture.cupy_source` for CuPy).
A source says what the framework did in the capture vocabulary (:mod:`harness.capture.events`)
and nothing more: which stream ran which op on which bytes, which bytes were handed out and given
back, which events were recorded and waited for. The watching process reads those events as they
come and translates them (:mod:`harness.capture.translate`) into the op records the race detector,
the trace writer and the reports already read, so a program's race is found, folded, reported and
checked (`gpurace check` on its trace) exactly as a scenario's is.

Nothing here imports PyTorch or CuPy at module level: the translator runs, and is tested, where
neither is installed.
"""
