"""Shared fixtures: backend-generic tests run on sim here and on cuda under `make test-gpu`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import kvcore

BACKENDS = ["sim", pytest.param("cuda", marks=pytest.mark.gpu)]

# The real programs are scripts the corpus runner runs on a GPU (tests/test_real_programs_gpu.py),
# not tests. (A conftest.py of their own would shadow this one's module name.)
collect_ignore = ["real_programs"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="session")
def cuda_device() -> kvcore.Device:
    """One CUDA device for the in-process GPU tests (kernels compile once per session)."""
    return kvcore.open_device("cuda")


def make_device(backend: str, request: pytest.FixtureRequest,
                defects: kvcore.Defects = kvcore.Defects(), seed: int = 0) -> kvcore.Device:
    """A device of ``backend``. On cuda the session's device is reused with its defects
    swapped, since every test builds its own pool on it."""
    if backend == "sim":
        return kvcore.open_device("sim", defects=defects, seed=seed)
    device = request.getfixturevalue("cuda_device")
    device.defects = defects
    return device


def trial_contexts(backend: str, request: pytest.FixtureRequest, defects: kvcore.Defects,
                   trials: int) -> Iterator[kvcore.DeviceContext]:
    """A DeviceContext per trial: on sim a fresh device seeded with the trial number, on cuda
    one context reused, as an engine keeps its streams (new streams every trial would pile up
    on CUDA's hardware queues and serialize by accident)."""
    if backend == "sim":
        for i in range(trials):
            yield kvcore.DeviceContext(make_device("sim", request, defects, seed=i))
        return
    context = kvcore.DeviceContext(make_device(backend, request, defects))
    for _ in range(trials):
        yield context
