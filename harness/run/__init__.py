"""Running trials: the executor that performs a scenario's steps on a device (the world it
builds, each step's handler, the checks), the worker processes that run trials and report each
one (``worker``, ``workers``, ``rayexec``), the runner that hands trials out, watches for
crashes and hangs and records results (``runner``), and what a run leaves behind: its outputs
folder, incident reports, merged shards and replays."""
