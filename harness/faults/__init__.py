"""Faults of the machine under a run: files that cannot be written, a run folder that went away.

:mod:`harness.faults.writes` holds the one policy every write of a run follows.
"""
