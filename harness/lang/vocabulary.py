"""The step vocabulary: every op a scenario step may name, the keys it takes, what each key holds,
and which names it defines, uses and gives back.

One table for everything that reads steps: the loader (which checks them, per variant, at their
file:line:col), the minimizer (which keeps a step's dependencies), the executor and the docs.
"""

from __future__ import annotations

from dataclasses import dataclass

# What a key's value holds.
STREAM = "stream"        # a stream of the scenario
COUNT = "count"          # a positive integer
INDEX = "index"          # a non-negative integer (an offset, a page number)
PAGES = "pages"          # a page number, or a list of them
BYTE = "byte"            # 0..255
DURATION = "duration"    # microseconds (or .inf)
MICROS = "micros"        # microseconds, finite: how long a kernel runs
BOOL = "bool"
LEASE = "lease"          # pages a materialize step made
CATALOG = "catalog"      # a catalog step's catalog
BUFFER = "buffer"        # a pinned host buffer that exists
NEW_BUFFER = "new-buffer"  # a pinned host buffer: defined here if it is new (a world buffer)
ALLOC_BUFFER = "alloc-buffer"  # a pinned host buffer allocated here from the recycling pool
EVENT = "event"          # an event some record_event step recorded
EVENTS = "events"        # one event, or a list of them
NEW_EVENT = "new-event"  # an event recorded here (defined if new)
MUTEX = "mutex"          # a host mutex, named where it is first locked
MEMORY = "memory"        # leases and pinned buffers that exist: one, or a list of them
LIST = "page-list"       # a pinned buffer a page_list step wrote, or a lease it was copied into
GRAPH = "graph"          # a CUDA graph a graph_capture step began

IN_WORDS = {
    STREAM: "a stream", COUNT: "a number from 1", INDEX: "a number from 0",
    PAGES: "a page number or a list", BYTE: "a byte, 0-255", DURATION: "microseconds, or .inf",
    MICROS: "microseconds",
    BOOL: "true or false", LEASE: "a lease", CATALOG: "a catalog", BUFFER: "a pinned buffer",
    NEW_BUFFER: "a pinned buffer (made here if new)", ALLOC_BUFFER: "a new pinned buffer",
    EVENT: "an event", EVENTS: "an event or a list", NEW_EVENT: "an event (made here if new)",
    MUTEX: "a host mutex (a name)",
    MEMORY: "a lease or pinned buffer, or a part ({lease: x, page: 1}, {buffer: b, offset: 0, "
            "length: 64}), or a list",
    LIST: "a page list: its pinned buffer, or a lease it was copied into",
    GRAPH: "a graph",
}
"""What each kind of value is, for `gpurace steps`."""

REFERENCES = {LEASE: "lease", CATALOG: "catalog", BUFFER: "buffer", EVENT: "event",
              EVENTS: "event", MEMORY: "memory", GRAPH: "graph"}
"""Keys whose value names something an earlier step made, and what kind of thing ("memory":
a lease or a pinned buffer, whichever the name is)."""

MEMORY_KINDS = ("lease", "buffer")
"""The kinds a ``memory`` reference may name."""

NOT_OPS: dict[str, str] = {}
"""Ops a user reaches for that gpurace says another way: what to write instead."""

OTHER_OP = {
    ("copy_page", "dst", "buffer"): "copy_page copies between leases; copy_to_host copies a "
                                    "lease's pages into a pinned buffer",
    ("copy_page", "src", "buffer"): "copy_page copies between leases; copy_from_host copies a "
                                    "pinned buffer into a lease",
    ("copy_from_host", "src", "lease"): "copy_from_host copies a pinned buffer into a lease; "
                                        "copy_page copies a lease's pages to another lease",
    ("copy_to_host", "dst", "lease"): "copy_to_host copies into a pinned buffer; copy_page "
                                      "copies a lease's pages to another lease",
}
"""(op, key, the kind the name is) -> the op that takes it, where a step names a thing of
another kind than its key holds."""

KEY_ELSEWHERE = {
    ("release", "after"): "release fences its pages itself (kvcore's release fence: the "
                          "next owner's work waits for the streams still using them); a "
                          "pinned buffer handed out again only once events complete is "
                          "host_free's `after:`",
}
"""(op, key) -> what to write instead, for a key another op has."""

HOW_TO_DEFINE = {
    "lease": "a materialize step with an id defines one",
    "catalog": "a catalog step with an id defines one",
    "buffer": "a host_fill, copy_to_host, page_list, gather or host_alloc step defines one",
    "event": "a record_event step records one",
    "graph": "a graph_capture step with an id begins one",
}


@dataclass(frozen=True)
class Key:
    holds: str
    required: bool = False


@dataclass(frozen=True)
class Op:
    """One op: its keys (besides ``id``, ``op``, ``only`` and ``unless``), the kind of thing
    its ``id`` names (if any), which key gives a thing back, and which keys come in
    exactly-one-of groups."""

    keys: dict[str, Key]
    doc: str
    id_defines: str | None = None
    frees: tuple[str, str] | None = None  # (key, kind): the value is given back here
    one_of: tuple[tuple[tuple[str, ...], str], ...] = ()  # (keys, meaning): exactly one
    at_most_one: tuple[str, ...] = ()

    def required(self) -> tuple[str, ...]:
        return tuple(k for k, key in self.keys.items() if key.required)


def _k(holds: str, required: bool = False) -> Key:
    return Key(holds, required)


_FOLLOWS = ((("catalog", "page_list"), "catalog (its table row) or page_list (a page list, "
                                        "pinned or copied into a lease), to follow"),)

OPS: dict[str, Op] = {
    "materialize": Op({"pages": _k(COUNT, True), "stream": _k(STREAM)},
                      "lease pages from the pool (the id names them); with `allocator: "
                      "caching`, on `stream` (default compute), whose own freed pages come "
                      "first", id_defines="lease"),
    "record_stream": Op({"lease": _k(LEASE, True), "stream": _k(STREAM, True)},
                        "tell the caching allocator (`allocator: caching`) that `stream` uses "
                        "the lease: its release records an event there, and its pages are "
                        "handed out again only once a query sees it done"),
    "release": Op({"lease": _k(LEASE, True)}, "give a lease's pages back to the pool",
                  frees=("lease", "lease")),
    "host_fill": Op({"buffer": _k(NEW_BUFFER, True), "byte": _k(BYTE, True),
                     "pages": _k(COUNT), "page": _k(PAGES), "offset": _k(INDEX),
                     "length": _k(COUNT)},
                    "the host writes a byte into a pinned buffer: all of it, some pages "
                    "(page), or a byte range (offset, length)",
                    at_most_one=("page", "offset")),
    "host_alloc": Op({"buffer": _k(ALLOC_BUFFER, True), "pages": _k(COUNT)},
                     "a pinned host buffer from the recycling pinned pool (reuses freed bytes)"),
    "host_free": Op({"buffer": _k(BUFFER, True), "after": _k(EVENTS)},
                    "give a pinned buffer back to the pool; with `after`, its bytes are handed "
                    "out again only once a query sees those events complete",
                    frees=("buffer", "buffer")),
    "copy_from_host": Op({"src": _k(BUFFER, True), "dst": _k(LEASE, True),
                          "stream": _k(STREAM, True)}, "async copy, pinned buffer -> pages"),
    "copy_to_host": Op({"src": _k(LEASE, True), "dst": _k(NEW_BUFFER, True),
                        "stream": _k(STREAM, True)}, "async copy, pages -> pinned buffer"),
    "copy_page": Op({"src": _k(LEASE, True), "dst": _k(LEASE, True),
                     "stream": _k(STREAM, True)}, "async copy of a page to another page"),
    "zero_pages": Op({"lease": _k(LEASE, True), "stream": _k(STREAM, True)},
                     "async memset of a lease's pages to zero"),
    "catalog": Op({}, "a retained per-conversation catalog (the id names it)",
                  id_defines="catalog"),
    "retain": Op({"catalog": _k(CATALOG, True), "lease": _k(LEASE, True)},
                 "keep a lease's pages in a catalog"),
    "bind": Op({"catalog": _k(CATALOG, True)}, "bind a catalog to an execution-table row"),
    "publish": Op({"catalog": _k(CATALOG, True), "stream": _k(STREAM, True)},
                  "publish the catalog's pages into its row (as activate)"),
    "activate": Op({"catalog": _k(CATALOG, True), "stream": _k(STREAM, True)},
                   "republish the catalog's row on a stream"),
    "release_catalog": Op({"catalog": _k(CATALOG, True)},
                          "end a conversation: unbind its table rows (what they hold stays on "
                          "the device) and release its pages, fenced as release is",
                          frees=("catalog", "catalog")),
    "read_table": Op({"catalog": _k(CATALOG, True), "stream": _k(STREAM, True),
                      "assert": _k(BOOL)},
                     "the table reader: asserts (or counts) on a stale or empty entry"),
    "page_list": Op({"buffer": _k(NEW_BUFFER, True), "lease": _k(LEASE, True)},
                    "the host writes a lease's pages into a pinned buffer as a page list "
                    "(int32 page, int32 generation each), which kernels read in place when "
                    "they run; copy_from_host of it into a lease makes a device index (a "
                    "block table) that kernels follow the same way"),
    "kv_write": Op({"catalog": _k(CATALOG), "page_list": _k(LIST), "byte": _k(BYTE, True),
                    "stream": _k(STREAM, True)},
                   "a kernel writes the byte over every page the catalog's table row (or a page "
                   "list) names, as it finds them when it runs (stale: someone else's pages)",
                   one_of=_FOLLOWS),
    "attention": Op({"catalog": _k(CATALOG), "page_list": _k(LIST), "byte": _k(BYTE, True),
                     "stream": _k(STREAM, True), "assert": _k(BOOL)},
                    "a kernel reads every page the catalog's table row (or a page list) names "
                    "and checks it holds the byte: asserts (or counts) on another owner's bytes",
                    one_of=_FOLLOWS),
    "gather": Op({"page_list": _k(LIST, True), "to": _k(NEW_BUFFER, True),
                  "stream": _k(STREAM, True)},
                 "a kernel copies every page a page list names into consecutive pages of a "
                 "pinned buffer (in place, zero-copy), as it finds the list when it runs"),
    "scatter": Op({"page_list": _k(LIST, True), "from": _k(BUFFER, True),
                   "stream": _k(STREAM, True)},
                  "a kernel copies consecutive pages of a pinned buffer into the pages a page "
                  "list names, as it finds the list when it runs"),
    "kernel": Op({"stream": _k(STREAM, True), "reads": _k(MEMORY), "writes": _k(MEMORY),
                  "byte": _k(BYTE), "us": _k(MICROS)},
                 "a kernel of the program's own (a forward pass, a normalize, a reduce) on "
                 "leases and pinned buffers, or parts of them (pages, byte ranges): it runs "
                 "`us` microseconds, reads all of `reads` and writes the byte (without one, "
                 "the first byte it read) over all of `writes` (the id names it in findings)"),
    "read_pinned": Op({"buffer": _k(BUFFER, True), "byte": _k(BYTE, True),
                       "stream": _k(STREAM, True)},
                      "a kernel reads a pinned buffer in place (zero-copy, as small-input "
                      "paths do) and counts the bytes that are not the byte"),
    "record_event": Op({"event": _k(NEW_EVENT, True), "stream": _k(STREAM, True)},
                       "record an event on a stream"),
    "wait_event": Op({"event": _k(EVENT, True), "stream": _k(STREAM, True)},
                     "make a stream wait for an event's latest record"),
    "event_query": Op({"event": _k(EVENT, True), "poll": _k(BOOL)},
                      "the host asks whether an event completed (poll: until it has)"),
    "synchronize": Op({"stream": _k(STREAM), "event": _k(EVENT)},
                      "the host waits: for the device, one stream, or one event",
                      at_most_one=("stream", "event")),
    "delay": Op({"stream": _k(STREAM, True), "us": _k(DURATION, True)},
                "occupy a stream for some microseconds (.inf: never ends)"),
    "graph_capture": Op({"stream": _k(STREAM, True)},
                        "begin capturing a CUDA graph (the id names it) from a stream of the "
                        "scenario's own: the steps up to its graph_end on that stream (and on "
                        "streams that fork in, waiting for an event recorded in the capture) "
                        "become the graph's nodes and do not run",
                        id_defines="graph"),
    "graph_end": Op({"graph": _k(GRAPH, True)}, "end a graph's capture"),
    "graph_replay": Op({"graph": _k(GRAPH, True), "stream": _k(STREAM, True)},
                       "launch a captured graph on a stream: its nodes run in capture order "
                       "after the stream's earlier work, on the bytes and pages they captured, "
                       "reading what is there when they run"),
    "lock": Op({"mutex": _k(MUTEX, True)},
               "the host takes a mutex, waiting while another thread holds it"),
    "unlock": Op({"mutex": _k(MUTEX, True)}, "the host gives back a mutex it holds"),
    "check": Op({"lease": _k(LEASE), "buffer": _k(BUFFER), "equals": _k(BUFFER),
                 "byte": _k(BYTE)},
                "compare device pages (lease) or a pinned buffer with a buffer or a byte",
                one_of=((("lease", "buffer"), "lease (device pages) or buffer (a host buffer), "
                                              "to read"),
                        (("equals", "byte"), "equals (a host buffer) or byte (0-255), to "
                                             "compare with"))),
}
"""Every step op. ``publish`` and ``activate`` are one op under two names."""

CAPTURABLE = frozenset({"copy_from_host", "copy_to_host", "copy_page", "zero_pages", "kernel",
                        "delay", "kv_write", "attention", "gather", "scatter", "read_pinned",
                        "record_event", "wait_event"})
"""The ops a graph captures: stream ops on a capturing stream, whose device work does not
depend on the host between capture and replay, and the events that fork and join its
branches."""

NOT_CAPTURED = {
    **dict.fromkeys(("host_fill", "host_alloc", "host_free", "page_list", "check", "lock",
                     "unlock", "event_query", "catalog", "retain", "bind"),
                    "the host does it once, now, not at each replay; put it before "
                    "graph_capture or after graph_end"),
    "synchronize": "the host cannot wait for the device while a stream captures (CUDA: "
                   "cudaErrorStreamCaptureUnsupported); synchronize after graph_end",
    **dict.fromkeys(("materialize", "release", "record_stream", "release_catalog"),
                    "a graph keeps the memory it was captured with, and CUDA refuses an "
                    "allocation during a capture; materialize before graph_capture, release "
                    "after the last graph_replay"),
    **dict.fromkeys(("activate", "publish", "read_table"),
                    "a catalog's table row is host state the executor publishes each time; "
                    "follow a page list (kv_write, attention) inside a graph instead"),
    **dict.fromkeys(("graph_capture", "graph_replay"),
                    "graphs do not nest here; graph_end this one first"),
}
"""Why an op may not stand between a graph_capture and its graph_end."""

VARIANT_KEYS = ("only", "unless")
"""Keys any step may carry to run in some variants only."""

THREAD_KEY = "thread"
"""The key any step may carry to run on a host thread of that name. Consecutive steps that
carry it form a parallel section: each thread runs its own steps in order, the threads run
concurrently, and the steps after the section wait for all of them."""

STEP_KEYS = ("id", "op", *VARIANT_KEYS, THREAD_KEY)
"""The keys every step may carry, whatever its op."""


def holds(op: str, key: str) -> str:
    """What the key ``key`` of a step ``op`` holds (``stream``, ``lease``, ``count``...)."""
    return OPS[op].keys[key].holds


def uses(op: str, args: dict[str, object]) -> list[tuple[str, str]]:
    """The (kind, name) pairs a step with these arguments refers to: what must exist before
    it runs."""
    out = []
    for key, value in args.items():
        spec = OPS[op].keys.get(key)
        if spec is None:
            continue
        kind = REFERENCES.get(spec.holds)
        if kind is None:
            continue
        names = value if isinstance(value, (list, tuple)) else [value]
        out += [(kind, part_name(name)) for name in names]
    return out


def part_name(item: object) -> str:
    """The lease or buffer a kernel's memory item names: the item itself, or a part's."""
    if isinstance(item, dict):
        return str(item.get("lease") or item.get("buffer"))
    return str(item)


def defines(op: str, step_id: str | None, args: dict[str, object]) -> list[tuple[str, str]]:
    """The (kind, name) pairs a step makes available to later steps."""
    spec = OPS[op]
    out = []
    if spec.id_defines and step_id is not None:
        out.append((spec.id_defines, step_id))
    for key, value in args.items():
        key_spec = spec.keys.get(key)
        if key_spec is not None and key_spec.holds in (NEW_BUFFER, ALLOC_BUFFER):
            out.append(("buffer", str(value)))
        elif key_spec is not None and key_spec.holds == NEW_EVENT:
            out.append(("event", str(value)))
    return out


def frees(op: str, args: dict[str, object]) -> tuple[str, str] | None:
    """The (kind, name) a step gives back, after which it may not be used."""
    spec = OPS[op].frees
    return None if spec is None else (spec[1], str(args[spec[0]]))
