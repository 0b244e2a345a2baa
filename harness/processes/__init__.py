"""Processes gpurace starts and watches: how a child's life is tied to the process that made
it (:mod:`harness.processes.lifetime`)."""
