"""The lanes of a run: one device its trials go to (a GPU, or a simulated device), with the
worker supply that feeds it, and how many trials it is handed at a time."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from harness.gpu.watch import FatalXid, same_pci
from harness.results.outcome import TrialResult
from harness.run.workers import Worker, WorkerSupply


SPARES_DEFAULT = {"sim": 4, "cuda": 0}
"""Spare workers a run keeps once its workers start dying, by backend, unless --spares says.
None on a GPU: there each spare is a CUDA context that lives while a crashed one is torn down,
and two fast crash soaks with spares (about three crashes a second, five or more contexts on
the GPU) each ended with an H200's firmware not answering the driver (Xid 119, a GSP timeout)
and the GPU needing a reset; one worker at a time had survived over a thousand."""


BATCH_MAX = 64
"""Trials handed to one lane at a time when there are several: small enough that a slow lane
holds few back, large enough that a hand-over is rare."""


@dataclass
class Lane:
    """One device the run's trials go to (a GPU, or a simulated device): its worker supply,
    the worker that runs its trials, the trials handed to it and not yet ended, and the last
    trial of a worker that died, still to record."""

    name: str
    supply: WorkerSupply
    pin: str | None = None  # its workers' CUDA_VISIBLE_DEVICES (a GPU's UUID where known)
    worker: Worker | None = None
    inflight: deque[tuple[int, int]] = field(default_factory=deque)
    started: float = 0.0  # monotonic: when the trial in flight started (its Xids since)
    died_at: float | None = None
    dead: tuple[Worker, TrialResult] | None = None
    dead_started: float = 0.0  # when the dead worker's last trial started
    dead_by: float = 0.0  # monotonic: when a dead worker still not ended is put down
    retired: str = ""
    device: dict[str, object] = field(default_factory=dict)  # what its worker said it runs on

    @property
    def uuid(self) -> str | None:
        """The GPU's UUID, as its workers said or its pin names (None on sim, or before a
        worker of a lane not pinned by UUID started)."""
        said = self.device.get("uuid")
        return str(said) if said else (self.pin if self.pin and self.pin.startswith("GPU-")
                                       else None)

    def dead_ended(self) -> bool:
        """Whether the dead worker's process has ended, or is due to be put down."""
        assert self.dead is not None
        return not self.dead[0].proc.is_alive() or time.monotonic() >= self.dead_by

    def dead_signal(self) -> Connection | int:
        """What becomes ready when the dead worker's process ends: its sentinel (a Ray actor
        has none; its pipe closes once Ray has said it ended)."""
        assert self.dead is not None
        worker = self.dead[0]
        return getattr(worker.proc, "sentinel", None) or worker.conn

    def hit_by(self, ev: FatalXid, lanes: int) -> bool:
        """Whether fatal report ``ev`` is about this lane's GPU, on a run of ``lanes`` lanes."""
        if ev.pci is not None:
            return same_pci(ev.pci, self.device.get("pci_bus_id"))  # type: ignore[arg-type]
        return lanes == 1 or ev.gpu_uuid is None or self.uuid is None or ev.gpu_uuid == self.uuid

    def close(self) -> None:
        """Stop the lane's workers: the one running (it is idle or its GPU is retired) and the
        spares."""
        if self.worker is not None:
            self.worker.stop()
            self.worker = None
        if self.dead is not None:
            self.dead[0].stop()
        self.supply.close()


def lane_count(spec: str, everything: int) -> int:
    """How many lanes ``--gpus`` asks for where it names no GPU of its own: ``all`` is
    ``everything``, ``N`` is N, ``0,2`` is two."""
    return everything if spec == "all" else int(spec) if spec.isdigit() else len(
        spec.split(","))
