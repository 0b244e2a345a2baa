"""Every bound on what gpurace reads from a file, in one place.

Scenario and suite YAML, tickets, op traces and the files `gpurace minimize` follows are input
from people and from other machines: each is checked against these limits before anything is
built from it, so a bad file is one error line (``file:line:col: field: what is wrong, the
limit, what to do``, exit 2) within a second, never a traceback, a worker that dies on kvcore's
refusal, or a run that takes unbounded time or memory. docs/limits.md lists
them for users; each docstring says why its number is what it is.
"""

from __future__ import annotations

from reports.incident import REPORT_MAX_BYTES as _REPORT_MAX_BYTES

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

# ---- files ---------------------------------------------------------------------------------------

YAML_MAX_BYTES = 256 * KiB
"""Bytes of a scenario or suite file. The largest shipped scenario is 3 KiB, and the ninfer-210
ticket written out as steps (839 of them) is 48 KiB. PyYAML reads about 300 KiB of YAML a
second: with :data:`YAML_MAX_NODES`, any file is read, or refused, within a second."""

TICKET_MAX_BYTES = 8 * MiB
"""Bytes of a ticket: about 40,000 requests (ninfer-210's 118 requests take 25 KiB). One of
8 MiB is read and checked, or refused at its last line, in half a second."""

TRACE_MAX_BYTES = 8 * MiB
"""Bytes of an op trace read whole: about 38,000 ops (the ninfer-210 replay's whole trial is
1,400 ops, 0.3 MiB). One of 8 MiB is read, or refused at its last line, in about half a second,
in about 200 MiB of memory; a larger one grows both in proportion. `gpurace check`, and
`minimize` of a watched run, read a larger trace a line at a time (``stream_trace``), in the
memory of one record, still bounded by :data:`TRACE_MAX_OPS`."""

REPORT_MAX_BYTES = _REPORT_MAX_BYTES
"""Bytes of an incident's report.json that gpurace reads back (report show, report list,
minimize): the reports package's own bound, since it reads reports without the harness."""

SHARDS_MAX = 10_000
"""Parts a run may be split into with --shard: more machines than any array job holds."""

SPARES_MAX = 16
"""Spare workers --spares may keep ready: each holds a CUDA context and its pool, and they
start one per hand-over, so a few cover a worker start of a second or less at a crash every
quarter second."""

GPUS_MAX = 64
"""Lanes --gpus may ask for: GPUs of one host (eight is common, a few more exist), or
simulated devices side by side, one a CPU core."""

RUN_MAX_BYTES = 64 * MiB
"""A run document `gpurace merge` reads. A variant's entry is bounded (10,000 crash requests,
its folded findings and Xids), so even a run of a thousand variants stays far below this."""

HEAD_BYTES = 64 * KiB
"""Bytes read to tell what kind of file a path is (an op trace's header line), whatever its
size."""

# ---- YAML structure ------------------------------------------------------------------------------

YAML_MAX_DEPTH = 64
"""Nesting of YAML mappings and lists. A scenario nests 5 deep (spec.steps[3].after[0]); PyYAML
composes recursively and hits Python's recursion limit near 500."""

JSON_MAX_DEPTH = 64
"""Nesting of arrays and objects in one line of a ticket or an op trace. No record nests more
than 3 deep; Python's json reader gives up far deeper, at a depth that depends on its
version."""

YAML_MAX_NODES = 30_000
"""YAML nodes (mappings, lists, scalars) in one document, an alias counted as a copy of what it
names (so ``*a`` repeated cannot make the loader walk more than this). 2,048 steps take about
20,000 nodes; PyYAML composes 30,000 in about half a second."""

TEXT_MAX_CHARS = 1024
"""Characters of any one value: a description, a path, a tag, a trace's strings. Longer values
are refused before they are read as numbers (Python refuses to read integers of more than 4,300
digits) or echoed."""

NAME_MAX_CHARS = 64
"""Characters of a name: scenario, suite, variant, stream, step id, buffer, event, ticket,
conversation. A scenario's name names its incident folders, and a file name has at most 255
bytes."""

ECHO_MAX_CHARS = 60
"""Characters of a file's value that an error message quotes; longer ones are cut with "…"."""

# ---- scenarios -----------------------------------------------------------------------------------

STEPS_MAX = 2048
"""Steps in a scenario: the ninfer-210 ticket as steps (what `gpurace minimize` starts from)
takes 839."""

VARIANTS_MAX = 64
"""Variants in a scenario (the zoo's have two): each runs in its own worker."""

KERNEL_MEMORY_MAX = 64
"""Leases and buffers one kernel step reads (and as many it writes): a forward pass over a
batch's blocks names a few; each is a span of the kernel's, launched eight spans at a time."""

STREAMS_MAX = 32
"""Streams a scenario declares. kvcore's pool tracks at most 64 streams that use its pages (one
more is the check's own)."""

TAGS_MAX = 64
"""Tags in a scenario's metadata."""

PLANES_MAX = 16
"""Planes of a page (keys, values, scales...)."""

POOL_MAX_PAGES = 65_536
"""Pages of a pool (``spec.pool.pages``, a ticket's ``pool_pages``): kvcore keeps per-page state
and one generation per page; an H200's 141 GB in 2 MiB pages is 70,000."""

PAGE_MAX_TOKENS = 65_536
"""Tokens of a page (``page_tokens``); engines use 16 to 256."""

PLANE_MAX_DIM = 65_536
"""A plane's ``leading`` and ``heads``."""

ALIGN_MAX = 65_536
"""A plane's ``align`` (a power of two; 256 is the default)."""

PAGE_MAX_BYTES = 64 * MiB
"""Bytes of one page: kvcore's staging buffer for scattered copies (64 MiB) holds one page at
least."""

TABLE_MAX_ROWS = 4096
"""Execution-table rows (``spec.pool.table_rows``); kvcore makes an event per row."""

WORLD_MAX_BYTES = 1 * GiB
"""Bytes a scenario's world allocates in all: the device pool (pages x page bytes), the
execution table and its pinned shadow (rows x entries x 8 bytes, twice) and the pinned host
buffers (the check's readback, as many pages as the pool, and every host buffer). The simulated
device keeps all of it in the worker's memory."""

COUNTED_READS_MAX = 64
"""``read_table`` steps with ``assert: false`` in one variant: each counts into its own slot of a
64-slot counter buffer."""

TRIALS_MAX = 1_000_000
"""A scenario's ``trials``."""

TIMEOUT_MAX_S = 86_400.0
"""Seconds a trial may take (``spec.timeout``, and ``--timeout``): a day. The watchdog's wait
overflows past 2,147,483 s."""

DISK_MAX_MB = 1 << 30
"""`gpurace watch --disk-mb`: a petabyte, past any disk (0 already means no limit)."""

DELAY_MAX_US = 10_000_000.0
"""Microseconds of a delay (``amplify.delay_us``, each ``sweep`` entry, a ``delay`` step other
than ``.inf``): 10 s. A race window is microseconds wide; 1 ms amplifies every shipped race."""

SWEEP_MAX = 64
"""Delays in ``amplify.sweep``: each is a whole run of the variant."""

PRIORITY_MIN = -1000
"""Lowest stream priority. CUDA clamps a priority to the device's range (-5..0 on an H200)."""

PRIORITY_MAX = 1000
"""Highest stream priority (see :data:`PRIORITY_MIN`)."""

REQUESTS_MAX = 100_000
"""Requests of a conversation workload, and of a ticket."""

# ---- tickets -------------------------------------------------------------------------------------

LANES_MAX = 1024
"""A ticket's lanes (batch slots): each takes a table row."""

TOKENS_MAX = 1 << 31
"""A request's token counts: more than any model's context."""

TIME_MAX_MS = 1e15
"""A request's ``time_ms``: about 30,000 years; anything later is a unit mistake."""

# ---- op traces -----------------------------------------------------------------------------------

TRACE_MAX_BUFFER_BYTES = 256 * GiB
"""Bytes of one buffer of an op trace: more than any GPU's memory (an H200 has 141 GB)."""

TRACE_MAX_BUFFERS = 65_536
"""Buffer records of an op trace."""

TRACE_MAX_STREAMS = 256
"""Stream records of an op trace: the detector keeps a clock per stream and looks at every
stream at each legacy-stream op."""

TRACE_MAX_OPS = 1 << 20
"""Ops of one op trace, its reissued runs expanded: a run record of a few bytes stands for a
whole program piece, so the file's size alone does not bound the detector's work over it (an
8 MiB trace of op lines holds about 100,000)."""

TRACE_MAX_PROGRAM_OPS = 65_536
"""Ops of one program record (a piece of a reissued trial)."""

TRACE_MAX_ACCESSES = 2 * POOL_MAX_PAGES
"""Byte ranges one op reads or writes: a scatter of every page of the largest pool writes one
range per page."""

SEED_MAX = (1 << 64) - 1
"""A trace header's seeds (gpurace's trial seeds are 32-bit)."""

COUNT_MAX = (1 << 63) - 1
"""Any other integer of a trace (seq, times, ids, priorities): a signed 64-bit integer, as the
tools that write them use."""

