"""Running trials: the executor that performs a scenario's steps on a device (``executor``), by
job: the world it builds once and keeps (``world``), each step's handler and the host threads
(``steps``), the checks (``checks``), the request-level workloads (``workloads``); the worker
processes that run trials and report each one (``worker``, ``workers``, ``rayexec``), the runner
that hands trials out, watches for crashes and hangs and records results (``runner``), and what
a run leaves behind: its outputs folder, incident reports, merged shards and replays."""
