"""What kvcore would refuse when a scenario's steps run, checked as the step list is read.

Each variant's steps are followed as kvcore would see them, so that the loader refuses what
kvcore would, first, at the step (a worker never dies on it): pages leased at once against the
pool's pages, table rows bound against the table's rows, pages a catalog publishes or a reader
reads against a row's entries, a catalog published with a page it no longer leases, counting
kernels against the executor's counters, a copy or a check that overruns a host buffer, host
buffers past the world's byte limit. :class:`Capacity` keeps what each variant uses so far;
the names the steps make are the step list's (:class:`harness.lang.scope.Scope`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from yaml.nodes import Node

from harness import limits as L
from harness.lang.footprint import Footprint
from harness.lang.scope import Scope, Sites
from harness.lang.yamlnodes import Fields, Reader
from kvcore.device.kernels import TABLE_ENTRY_BYTES


@dataclass
class _Catalog:
    """A catalog as one variant's steps leave it: the leases it retains (-> the step that
    retained it), its pages, and the table rows bound to it."""

    leases: dict[str, int] = field(default_factory=dict)
    pages: int = 0
    binds: list[int] = field(default_factory=list)  # the bind steps of its rows

    @property
    def rows(self) -> int:
        return len(self.binds)


@dataclass
class _Usage:
    """What one variant's steps use of the world so far."""

    world: dict[str, int] = field(default_factory=dict)  # world buffer -> pages (largest use)
    alloc_pages: int = 0  # pages of every host_alloc (the executor sizes its arena for all)
    leased: int = 0  # pool pages leased now
    rows: list[int] = field(default_factory=list)  # the steps that bound each table row
    catalogs: dict[str, _Catalog] = field(default_factory=dict)
    counted: int = 0  # read_table and attention steps that count instead of asserting
    bytes: set[int] = field(default_factory=set)  # byte values steps write or expect
    page_lists: dict[str, int] = field(default_factory=dict)  # buffer -> entries last written

    def host_pages(self) -> int:
        return sum(self.world.values()) + self.alloc_pages


@dataclass
class _Need:
    """What a step needs of a world buffer in one variant, checked once every step is read (a
    world buffer is as large as its largest use in the variant): pages, bytes, or as many pages
    as another world buffer has (``like``)."""

    node: Node
    path: str
    variant: str
    buffer: str
    page_end: int = 0  # pages the step needs the buffer to have
    byte_end: int = 0  # bytes likewise
    like: str | None = None  # a buffer whose pages this one must have at least
    why: str = ""  # what the step does with them, for the message
    pages: int = 0  # what the buffer has, once known
    fixed: bool = False  # ``pages`` is a host_alloc'd buffer's, known when the step was read


class Capacity:
    """What each variant's steps use of the world, checked step by step (module docstring).
    It reads the names and sizes in ``scopes``, the step list's, and marks the leases a
    released catalog gives back there."""

    def __init__(self, reader: Reader, world: Footprint, scopes: dict[str, Scope],
                 sites: Sites) -> None:
        self.reader = reader
        self.world = world
        self.page_bytes = world.page_bytes
        self.host_budget = world.host_pages(L.WORLD_MAX_BYTES)  # pages of host buffers
        self.scopes = scopes
        self.usage = {v: _Usage() for v in scopes}
        self.sites = sites
        self.needs: list[_Need] = []  # on world buffers: checked once every step is read
        self.now: list[_Need] = []  # on allocated buffers: checked once the step is read

    def check_now(self) -> None:
        """Check what the step just read needs of host_alloc'd buffers (their sizes are
        known)."""
        self.check_needs(self.now)
        self.now = []

    def resources(self, f: Fields, op: str, step_id: str | None, args: dict[str, object],
                  v: str, index: int) -> None:
        """What kvcore would refuse when step ``index`` runs in variant ``v`` (module
        docstring), checked against the variant's state before the step, which is then brought
        up to date."""
        scope, use = self.scopes[v], self.usage[v]
        within = self.sites.within(v)
        if op == "materialize":
            pages = int(args["pages"])  # type: ignore[arg-type]
            if use.leased + pages > self.world.pages:
                raise self.reader.error(f.values["pages"], f.sub("pages"), (
                    f"{pages} more page{'s' if pages != 1 else ''} while {use.leased} of "
                    f"the pool's {self.world.pages} are leased{within}: the pool would run "
                    "out; release pages first, or raise spec.pool.pages"))
            use.leased += pages
        elif op == "release":
            use.leased -= scope.lease_pages[str(args["lease"])]
        elif op == "retain":
            catalog = use.catalogs[str(args["catalog"])]
            lease = str(args["lease"])
            if lease in catalog.leases:
                first = catalog.leases[lease]
                raise self.reader.error(f.values["lease"], f.sub("lease"), (
                    f"catalog {args['catalog']!r} retains lease {lease!r} already "
                    f"(steps[{first}], {self.sites.at(first)}){within}; a catalog keeps a page "
                    "once (kvcore would give it back twice when the conversation ends): remove "
                    "this retain"))
            catalog.leases[lease] = index
            catalog.pages += scope.lease_pages[lease]
        elif op == "catalog":
            use.catalogs[str(step_id)] = _Catalog()
        elif op == "bind":
            if len(use.rows) >= self.world.table_rows:
                rows = self.world.table_rows
                by = ", ".join(f"steps[{i}]" for i in use.rows[:8])
                raise self.reader.error(f.node, f.path, (
                    f"no table row is left to bind{within}: the table's {rows} "
                    f"row{'s are' if rows != 1 else ' is'} bound already ({by}; "
                    "spec.pool.table_rows), and a catalog bound twice takes two; raise "
                    "table_rows or bind fewer times"))
            use.rows.append(index)
            use.catalogs[str(args["catalog"])].binds.append(index)
        elif op == "release_catalog":
            catalog = use.catalogs[str(args["catalog"])]
            for lease in catalog.leases:
                gone = scope.gone.get(("lease", lease))
                if gone is not None:
                    raise self.reader.error(f.values["catalog"], f.sub("catalog"), (
                        f"catalog {args['catalog']!r} retains lease {lease!r}, released at "
                        f"steps[{gone}] ({self.sites.at(gone)}){within}: kvcore would release "
                        "it twice; leave the lease to the catalog"))
                scope.gone[("lease", lease)] = index
                use.leased -= scope.lease_pages[lease]
            for bind in catalog.binds:
                use.rows.remove(bind)
        elif op in ("kv_write", "attention", "gather", "scatter") and "page_list" in args:
            self.list_use(f, op, args, v)
        elif op in ("activate", "publish", "read_table", "kv_write", "attention"):
            self.table_use(f, op, args, v)
        elif op == "page_list":
            entries = scope.lease_pages[str(args["lease"])]
            most = self.page_bytes // TABLE_ENTRY_BYTES
            if entries > most:
                raise self.reader.error(f.values["lease"], f.sub("lease"), (
                    f"lease {args['lease']!r} has {entries} pages; a page list holds at most "
                    f"{most} entries of {TABLE_ENTRY_BYTES} bytes (one page of the buffer): "
                    "list a smaller lease"))
            use.page_lists[str(args["buffer"])] = entries
        elif op == "read_pinned":
            self.count_slot(f.node, f.path, v)
        elif op in ("copy_from_host", "copy_to_host"):
            lease, buffer = (args["dst"], args["src"]) if op == "copy_from_host" else \
                (args["src"], args["dst"])
            key = "src" if op == "copy_from_host" else "dst"
            pages = scope.lease_pages[str(lease)]
            if op == "copy_from_host":
                # The lease holds what the buffer holds: a page list copied in is a device
                # index kernels can follow; anything else copied over one is not.
                listed = use.page_lists.get(str(buffer))
                if listed is not None:
                    use.page_lists[str(lease)] = listed
                else:
                    use.page_lists.pop(str(lease), None)
            self.need_pages(f.values[key], f.sub(key), v, str(buffer), pages,
                            f"lease {lease!r} has {pages} page{'s' if pages != 1 else ''}, "
                            "all copied")
        elif op == "check" and "equals" in args:
            if "lease" in args:
                pages = scope.lease_pages[str(args["lease"])]
                self.need_pages(f.values["equals"], f.sub("equals"), v, str(args["equals"]),
                                pages, f"lease {args['lease']!r} has {pages} "
                                f"page{'s' if pages != 1 else ''}, all compared")
            else:
                self.need_like(f, v, str(args["equals"]), str(args["buffer"]))
        elif op == "host_alloc":
            pages = int(args.get("pages", 1))  # type: ignore[arg-type]
            use.alloc_pages += pages
            self.host_budget_left(f.values["buffer"], f.sub("buffer"), v, str(args["buffer"]))
        if "byte" in args:
            use.bytes.add(int(args["byte"]))  # type: ignore[arg-type]
            if len(use.bytes - {0}) >= 255:
                # The GPU scrubs pages between trials with a byte no step uses.
                raise self.reader.error(f.values["byte"], f.sub("byte"), (
                    f"steps{within} use every byte value from 1 to 255; leave one unused (the "
                    "GPU fills pages between trials with a byte no step writes or expects)"))

    def table_use(self, f: Fields, op: str, args: dict[str, object], v: str) -> None:
        """An activation publishes a catalog's pages into each row bound to it; a reader reads
        the first row's entries (at least one). kvcore refuses an unbound catalog, more pages
        than a row has entries, a page no longer leased (at a publish), and more counting
        readers than the counter buffer has slots."""
        scope, use = self.scopes[v], self.usage[v]
        name = str(args["catalog"])
        catalog = use.catalogs[name]
        node, path = f.values["catalog"], f.sub("catalog")
        within = self.sites.within(v)
        if not catalog.rows:
            made = scope.names[("catalog", name)]
            raise self.reader.error(node, path, (
                f"catalog {name!r} (steps[{made}], {self.sites.at(made)}) is bound to no table "
                f"row{within}; bind it first (a bind step before this one)"))
        row = self.world.row_pages
        follows = op in ("read_table", "kv_write", "attention")  # read the row on the device
        entries = max(1, catalog.pages) if follows else catalog.pages
        if entries > row:
            verb = "reads" if follows else "publishes"
            raise self.reader.error(node, path, (
                f"this {op} {verb} {entries} entries of catalog {name!r}{within}, more than a "
                f"table row's {row} (spec.pool.max_pages_per_row, or the pool's pages when "
                "0); raise max_pages_per_row, or retain fewer pages"))
        if not follows:
            for lease in catalog.leases:
                gone = scope.gone.get(("lease", lease))
                if gone is not None:
                    raise self.reader.error(node, path, (
                        f"catalog {name!r} retains lease {lease!r}, released at steps[{gone}] "
                        f"({self.sites.at(gone)}){within}: kvcore refuses to publish a page no "
                        "longer leased; activate before that release, or release the lease "
                        "only when the conversation ends"))
        elif op != "kv_write" and args.get("assert") is False:
            self.count_slot(f.values["assert"], f.sub("assert"), v)

    def list_use(self, f: Fields, op: str, args: dict[str, object], v: str) -> None:
        """A kernel that follows a page list needs one written before it (in the variant); a
        gather or scatter moves as many pages of its pinned buffer as the list has entries."""
        scope, use = self.scopes[v], self.usage[v]
        name = str(args["page_list"])
        entries = use.page_lists.get(name)
        if entries is None:
            lease = ("lease", name) in scope.names
            raise self.reader.error(f.values["page_list"], f.sub("page_list"), (
                f"lease {name!r} holds no page list{self.sites.within(v)} when this {op} runs: "
                "copy one into it first (copy_from_host of a buffer a page_list step wrote)"
                if lease else
                f"buffer {name!r} holds no page list{self.sites.within(v)} when this {op} runs: "
                "write one into it first (a page_list step)"))
        if op == "attention" and args.get("assert") is False:
            self.count_slot(f.values["assert"], f.sub("assert"), v)
        elif op in ("gather", "scatter"):
            key = "to" if op == "gather" else "from"
            self.need_pages(f.values[key], f.sub(key), v, str(args[key]), entries,
                            f"page list {name!r} has {entries} entr"
                            f"{'ies' if entries != 1 else 'y'}, a page each")

    def count_slot(self, node: Node, path: str, v: str) -> None:
        """A kernel that counts takes one of the executor's counters."""
        use = self.usage[v]
        use.counted += 1
        if use.counted > L.COUNTED_READS_MAX:
            raise self.reader.error(node, path, (
                f"more than {L.COUNTED_READS_MAX} counting kernels (read_table and attention "
                f"with assert: false, read_pinned){self.sites.within(v)}, the most there are "
                "counters for; let the table readers assert, or read fewer times"))

    # ---- host buffer sizes -----------------------------------------------------------------------
    def sizes(self, f: Fields, op: str, args: dict[str, object], v: str) -> None:
        """World buffers grow to their largest use in the variant (as the executor sizes
        them); ranges of allocated buffers are checked now, those of world buffers once every
        step is read."""
        scope, use = self.scopes[v], self.usage[v]
        if op in ("copy_to_host", "gather", "page_list"):
            # The pages the device writes there (a page list fits in one).
            key, pages = {
                "copy_to_host": ("dst", lambda: scope.lease_pages.get(str(args["src"]), 1)),
                "gather": ("to", lambda: use.page_lists.get(str(args["page_list"]), 1)),
                "page_list": ("buffer", lambda: 1)}[op]
            name = str(args[key])
            if name not in scope.allocated:
                self.grow(f.values[key], f.sub(key), v, name, pages())
            return
        if op != "host_fill":
            return
        name = str(args["buffer"])
        allocated = scope.allocated.get(name)
        if allocated is None:
            node, path = (f.values["pages"], f.sub("pages")) if "pages" in args else \
                (f.values["buffer"], f.sub("buffer"))
            self.grow(node, path, v, name, int(args.get("pages", 1)))  # type: ignore[arg-type]
        elif "pages" in args:
            raise self.reader.error(f.keys["pages"], f.sub("pages"), f"buffer {name!r} comes "
                                    "from host_alloc, which sets its size; use `page` to fill "
                                    "some of its pages")
        for key in ("page", "offset"):
            if key not in args:
                continue
            value = args[key]
            if key == "page":
                pages = value if isinstance(value, tuple) else (value,)
                need = _Need(f.values[key], f.sub(key), v, name, page_end=max(pages) + 1)
            else:
                length = int(args.get("length", 1))  # type: ignore[arg-type]
                need = _Need(f.values[key], f.sub(key), v, name,
                             byte_end=int(value) + length)  # type: ignore[arg-type]
            if allocated is not None:
                need.pages = allocated
                self.now.append(need)
            else:
                self.needs.append(need)
        if "length" in args and "offset" not in args:
            raise self.reader.error(f.keys["length"], f.sub("length"),
                                    "`length` goes with `offset` (a byte range); add offset")

    def grow(self, node: Node, path: str, v: str, name: str, pages: int) -> None:
        """World buffer ``name`` is at least ``pages`` pages in variant ``v``."""
        use = self.usage[v]
        if pages > use.world.get(name, 0):
            use.world[name] = pages
            self.host_budget_left(node, path, v, name)

    def host_budget_left(self, node: Node, path: str, v: str, name: str) -> None:
        use = self.usage[v]
        if use.host_pages() > self.host_budget:
            total = use.host_pages() * self.page_bytes
            raise self.reader.error(node, path, (
                f"with buffer {name!r}, the pinned host buffers{self.sites.within(v)} take "
                f"{total:,} bytes; beside the pool's other allocations "
                f"({self.world.describe()}), the world would take more than "
                f"{L.WORLD_MAX_BYTES:,} bytes (1 GiB), the most it may: use fewer or "
                "smaller buffers"))

    def need_pages(self, node: Node, path: str, v: str, buffer: str, pages: int,
                   why: str) -> None:
        """Buffer ``buffer`` must have ``pages`` pages when this step runs in ``v``."""
        allocated = self.scopes[v].allocated.get(buffer)
        need = _Need(node, path, v, buffer, page_end=pages, why=why)
        if allocated is not None:
            need.pages = allocated
            self.now.append(need)
        else:
            self.needs.append(need)

    def need_like(self, f: Fields, v: str, equals: str, read: str) -> None:
        """A check of buffer ``read`` against buffer ``equals`` compares every page of the
        first: the second must have as many."""
        scope = self.scopes[v]
        pages = scope.allocated.get(read)
        node, path = f.values["equals"], f.sub("equals")
        if pages is None:
            # The buffer read is a world buffer, sized once every step is read; the one it is
            # compared with may be either.
            allocated = scope.allocated.get(equals)
            self.needs.append(_Need(node, path, v, equals, like=read,
                                    why=f"buffer {read!r} is compared page by page",
                                    pages=allocated or 0, fixed=allocated is not None))
        else:
            self.need_pages(node, path, v, equals, pages, f"buffer {read!r} has {pages} "
                            f"page{'s' if pages != 1 else ''}, all compared")

    def check_world_needs(self) -> None:
        """Check what the steps need of world buffers, now that every step is read."""
        for need in self.needs:
            world = self.usage[need.variant].world
            if need.like is not None:
                need.page_end = world.get(need.like, 1)
                need.why += f" ({need.page_end} page{'s' if need.page_end != 1 else ''})"
            if not need.fixed:
                need.pages = world.get(need.buffer, 1)
        self.check_needs(self.needs)

    def check_needs(self, needs: list[_Need]) -> None:
        """Check needs, grouped by the node that asks (one need per variant the step runs
        in): the message names a variant only when the step fails in some of them."""
        groups: dict[int, list[_Need]] = {}
        for need in needs:
            groups.setdefault(id(need.node), []).append(need)
        for group in groups.values():
            failing = [n for n in group if self.fails(n)]
            if failing:
                self.check_need(failing[0], len(failing) < len(group))

    def fails(self, need: _Need) -> bool:
        return need.page_end > need.pages or need.byte_end > need.pages * self.page_bytes

    def check_need(self, need: _Need, some: bool) -> None:
        """Raise the error of a need that fails; ``some``: it fails in some variants only."""
        pages = need.pages
        nbytes = pages * self.page_bytes
        within = self.sites.within(need.variant) if some else ""
        has = f"{pages} page{'s' if pages != 1 else ''}"
        if need.why and need.page_end > pages:
            raise self.reader.error(need.node, need.path, (
                f"buffer {need.buffer!r} has {has}{within}, but {need.why}: the step would "
                f"overrun it; give the buffer {need.page_end} pages (host_fill pages:, or "
                "host_alloc pages:)"))
        if need.page_end > pages:
            raise self.reader.error(need.node, need.path, f"page {need.page_end - 1} is "
                                    f"outside buffer {need.buffer!r}, which has {has} "
                                    f"(0..{pages - 1}){within}")
        if need.byte_end > nbytes:
            raise self.reader.error(need.node, need.path, f"bytes up to {need.byte_end} are "
                                    f"outside buffer {need.buffer!r}, which has {nbytes} "
                                    f"bytes ({has} of {self.page_bytes}){within}")

