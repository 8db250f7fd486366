"""Fusion groups of one function: union-find over graph nodes with incrementally kept costs.

Passes build a :class:`Planner` from the IR (groups already recorded by earlier passes are
read back from ``opfuse.group``), propose merges, and write the groups back. Merging asks
the cost guard; each candidate leaves a ledger entry. Costs are updated incrementally
(work proportional to the smaller side), so planning stays near-linear in graph size.
"""

from __future__ import annotations

from typing import Callable

from mlir import ir

from .. import cost
from ..errors import OpfuseError
from . import ledger
from .graph import GROUP_ATTR, KIND_ATTR, FuncGraph, Node, value_bytes
from .group import FORCED_KINDS, Group, _shape, root_of  # noqa: F401  (re-exported)
from .opinfo import OpKind

_MOVERS = frozenset({OpKind.INJECTIVE, OpKind.BROADCAST})

#: ptxas's registers for a merge preview, ``measure(planner, p, c) -> int | None`` (None: keep
#: the estimate), used when the guard options ask for ``measure_registers``. The GPU backend
#: installs it (:func:`opfuse.backends.gpu.measure.install`): the planner sits below the backends
#: and does not import them.
_register_measure: Callable[["Planner", "Group", "Group"], int | None] | None = None


def use_register_measure(
        measure: Callable[["Planner", "Group", "Group"], int | None] | None) -> None:
    """Install (or, with None, remove) the measurement behind ``measure_registers``."""
    global _register_measure
    _register_measure = measure


class Planner:
    """Groups of one function and the merge operation every fusion pass uses."""

    def __init__(self, graph: FuncGraph, pass_name: str, options: cost.GuardOptions):
        self.graph = graph
        self.pass_name = pass_name
        self.options = options
        self.target = cost.get_target(options.target)
        self._parent = list(range(len(graph.nodes)))
        self._groups: dict[int, Group] = {g.gid: g for g in self._singletons()}
        self._gatherers = [n.index for n in graph.nodes if n.gathers]
        by_attr: dict[int, int] = {}
        for node in graph.nodes:  # groups recorded by earlier passes
            if node.group is None:
                continue
            first = by_attr.setdefault(node.group, node.index)
            if first != node.index:
                self._union(self.group(first), self.group(node.index))
        for node in graph.nodes:  # kinds the members do not tell
            if node.group is not None and KIND_ATTR in node.op.attributes:
                kind = ir.StringAttr(node.op.attributes[KIND_ATTR]).value
                if kind in FORCED_KINDS:
                    self.group(node.index).forced_kind = kind

    # ----- queries -----------------------------------------------------------------------
    def find(self, i: int) -> int:
        root = i
        while self._parent[root] != root:
            root = self._parent[root]
        while self._parent[i] != root:
            self._parent[i], i = root, self._parent[i]
        return root

    def group(self, node_index: int) -> Group:
        return self._groups[self.find(node_index)]

    def groups(self) -> list[Group]:
        """Groups in order of their first member."""
        return sorted(self._groups.values(), key=lambda g: g.first)

    def producer_groups(self, g: Group) -> list[Group]:
        """Groups that produce a value ``g`` reads, in block order."""
        seen, out = set(), []
        for v in g.reads:
            p = self.graph.producer.get(v)
            if p is not None:
                pg = self.group(p)
                if pg.gid not in seen:
                    seen.add(pg.gid)
                    out.append(pg)
        return sorted(out, key=lambda x: x.first)

    def consumer_groups(self, g: Group) -> list[Group]:
        seen, out = set(), []
        for v in g.outputs:
            for r in self.graph.readers(v):
                cg = self.group(r)
                if cg is not g and cg.gid not in seen:
                    seen.add(cg.gid)
                    out.append(cg)
        return sorted(out, key=lambda x: x.first)

    # ----- the merge ---------------------------------------------------------------------
    def fused_q(self, p: Group, c: Group) -> tuple[int, int]:
        """(Q of the union, bytes of the intermediates it keeps on chip)."""
        return self._fused_q(p, c, self._preview(p, c))

    def _fused_q(self, p: Group, c: Group, merged: Group) -> tuple[int, int]:
        """:meth:`fused_q` with the union's preview already made (``merged``)."""
        saved_reads = saved_writes = 0
        for v, b in p.outputs.items():
            if v in c.reads:
                saved_reads += b
                if self._only_read_by(v, p, c):
                    saved_writes += b
        return merged.q, saved_reads + saved_writes

    def evaluate(self, p: Group, c: Group) -> cost.Verdict:
        """Ask the guard about merging producer group ``p`` into consumer group ``c``."""
        return self._evaluate(p, c)[0]

    def _evaluate(self, p: Group, c: Group) -> tuple[cost.Verdict, Group]:
        """:meth:`evaluate`, and the preview of the union, which a merge then applies (one
        preview per candidate: it copies the reads and outputs of the consumer side)."""
        merged = self._preview(p, c)
        q_fused, q_inter = self._fused_q(p, c, merged)
        r_fused = estimate = merged.registers()
        if getattr(self.options, "measure_registers", False):
            if _register_measure is None:
                raise OpfuseError("measure_registers needs the GPU backend's measurement: "
                                  "call opfuse.backends.gpu.measure.install() first")
            r_fused = _register_measure(self, p, c) or estimate
        verdict = cost.guard(r_fused, p.q + c.q, q_fused, self.options, launches_saved=1)
        if r_fused != estimate:
            verdict.numbers["r_estimate"] = estimate  # r_fused is ptxas's figure
        flops = p.flops + c.flops
        verdict.numbers.update(
            w_fused=flops,
            ai_fused=round(cost.arithmetic_intensity(flops, q_fused), 3),
            t_saved_s=cost.t_saved(2, q_inter, self.target),
        )
        return verdict, merged

    def try_merge(self, p: Group, c: Group, *, why: str = "") -> bool:
        """Merge ``p`` into ``c`` if that keeps the graph acyclic and the guard agrees.
        Records a ledger entry either way."""
        via = self.cycle_via(p, c) or self.gather_via(p, c)
        if via is not None:
            self.refuse(p, c, via if via.startswith("gathers") else
                        f"would create a cycle through {via}")
            return False
        verdict, merged = self._evaluate(p, c)
        step = self._fuel(verdict)
        self._record(p, c, verdict.fuse, verdict.reason, verdict.numbers, verdict.would_fuse_with, why,
                     step=step)
        if verdict.fuse:
            self._union(p, c, merged)
        return verdict.fuse

    def try_merge_recomputed(self, p: Group, c: Group, *, flops_fused: int, why: str = "") -> bool:
        """Merge ``p`` into ``c`` where ``c`` reads ``p``'s results through a broadcast, so
        the merged kernel computes ``p`` again at several of its points (``flops_fused``:
        the merged kernel's flops, ``p``'s counted at every point that needs them). Decided
        in time by ``cost.recompute_guard``, like opfuse-fuse-recompute's copies; keeps the
        graph acyclic; one ledger entry either way."""
        via = self.cycle_via(p, c) or self.gather_via(p, c)
        if via is not None:
            self.refuse(p, c, via if via.startswith("gathers") else
                        f"would create a cycle through {via}")
            return False
        merged = self._preview(p, c)
        q_fused, _ = self._fused_q(p, c, merged)
        r_fused = merged.registers()
        verdict = cost.recompute_guard(r_fused, [(p.q, p.flops), (c.q, c.flops)],
                                       [(q_fused, flops_fused)], self.options)
        step = self._fuel(verdict)
        self._record(p, c, verdict.fuse, verdict.reason, verdict.numbers, verdict.would_fuse_with,
                     why, step=step)
        if verdict.fuse:
            self._union(p, c, merged)
        return verdict.fuse

    def merge_view(self, p: Group, c: Group, *, why: str = "") -> bool:
        """Merge ``p``, reshapes of arguments or constants only, into ``c`` whatever the
        saving: a view of memory that exists anyway is free in ``c``, while as a kernel of
        its own it copies its input for nothing (the guard weighs bytes against the kernels'
        traffic: a filter reshaped for a convolution is a few percent of it). Keeps the
        graph acyclic; one ledger entry either way."""
        via = self.cycle_via(p, c)
        if via is not None:
            self.refuse(p, c, f"would create a cycle through {via}")
            return False
        merged = self._preview(p, c)
        q_fused, _ = self._fused_q(p, c, merged)
        numbers = {"q_unfused": p.q + c.q, "q_fused": q_fused}
        verdict = cost.Verdict(True, f"a reshape of memory is a view: free in the consumer, "
                                     f"a {p.q} B copy as a kernel of its own", numbers)
        step = self._fuel(verdict)
        self._record(p, c, verdict.fuse, verdict.reason, numbers, verdict.would_fuse_with, why,
                     step=step)
        if verdict.fuse:
            self._union(p, c, merged)
        return verdict.fuse

    def try_merge_chain(self, p: Group, chain: list[Group], *, why: str = "") -> bool:
        """Merge ``p`` with every group of ``chain`` (each a consumer of the ones before), as
        one candidate: the guard sees the total saving. This is how a small glue op between
        two big ones (mean = sum / n between a reduction and x - mean) is judged by what
        fusing it enables, not by its own few bytes. Rolled back if any step would make a
        cycle or the guard refuses; one ledger entry either way."""
        c = chain[0]
        consumer, producer = self._consumer_node(p, c), self.graph.nodes[p.last].label
        q_unfused = p.q + sum(g.q for g in chain)
        saved = self._snapshot([p, *chain])
        merged = p
        for g in chain:
            via = self.cycle_via(merged, g) or self.gather_via(merged, g)
            if via is not None:
                self._restore(saved)
                self.refuse(p, c, via if via.startswith("gathers") else
                            f"would create a cycle through {via}")
                return False
            merged = self._union(merged, g)
        verdict = cost.guard(merged.registers(), q_unfused, merged.q, self.options,
                             launches_saved=len(chain))
        verdict.numbers.update(w_fused=merged.flops, kernels=len(chain) + 1,
                               t_saved_s=cost.t_saved(len(chain) + 1, q_unfused - merged.q, self.target))
        step = self._fuel(verdict)
        if not verdict.fuse:
            self._restore(saved)
        names = ", ".join(self.graph.nodes[g.last].label for g in chain[1:])
        reason = verdict.reason + (f" (together with {names})" if names else "")
        self._record(p, c, verdict.fuse, reason, verdict.numbers, verdict.would_fuse_with, why,
                     consumer=consumer, producer=producer, step=step)
        return verdict.fuse

    def try_merge_set(self, groups: list[Group], *, why: str, producer: Node, consumer: Node,
                      kind: str | None = None, registers: int | None = None,
                      check=None, beside=None, numbers: dict | None = None,
                      note: str = "") -> bool:
        """Merge ``groups`` into one (of ``kind``, when given), as one candidate: refused if
        the union would make the kernel graph cyclic or ``check(merged)`` says why not
        (returning why), then the guard decides on the total saving, with ``registers``
        for R_fused when given. ``beside(merged)``, when given, is (kernels, bytes) of
        kernels the merge needs next to the merged group (attention's copy of a returned
        K or V): their bytes count in Q_fused, their launches against the launches saved.
        Rolled back unless fused; one ledger entry either way, recorded as
        ``producer -> consumer`` (with ``numbers`` added, and ``note`` after the reason of
        a fusion)."""
        groups = sorted({g.gid: g for g in groups}.values(), key=lambda g: g.first)
        saved = self._snapshot(groups)
        q_unfused = sum(g.q for g in groups)

        def refuse(reason: str) -> bool:
            self._restore(saved)
            self._record(groups[0], groups[-1], False, reason, {}, None, why,
                         consumer=consumer, producer=producer.label)
            return False

        merged = groups[0]
        for g in groups[1:]:
            merged = self._union(merged, g)
        # pairwise unions assume producer before consumer; here any group may feed any
        members = set(merged.members)
        merged.reads = {v: b for g in saved for v, b in g.reads.items()
                        if self.graph.producer.get(v) not in members}
        merged.outputs = {v: b for g in saved for v, b in g.outputs.items()
                          if v in self.graph.returned
                          or any(r not in members for r in self.graph.readers(v))}
        # only the whole set must be acyclic (a path out of it and back in): part of it may
        # not be (Q·Kᵀ and P·V without the softmax between them)
        via = self.cycle_via(merged, merged)
        if via is not None:
            return refuse(f"would create a cycle through {via}")
        if kind is not None:
            merged.forced_kind = kind
        why_not = check(merged) if check is not None else None
        if why_not is not None:
            return refuse(why_not)
        r_fused = registers if registers is not None else merged.registers()
        extra_kernels, extra_q = beside(merged) if beside is not None else (0, 0)
        q_fused = merged.q + extra_q
        verdict = cost.guard(r_fused, q_unfused, q_fused, self.options,
                             launches_saved=len(groups) - 1 - extra_kernels)
        verdict.numbers.update(w_fused=merged.flops, kernels=len(groups),
                               t_saved_s=cost.t_saved(len(groups) - extra_kernels,
                                                      q_unfused - q_fused, self.target),
                               **(numbers or {}))
        step = self._fuel(verdict)
        if not verdict.fuse:
            self._restore(saved)
        reason = verdict.reason + (f" ({note})" if note and verdict.fuse else "")
        self._record(groups[0], groups[-1], verdict.fuse, reason, verdict.numbers,
                     verdict.would_fuse_with, why, consumer=consumer, producer=producer.label,
                     step=step)
        return verdict.fuse

    @staticmethod
    def _fuel(verdict: cost.Verdict) -> int | None:
        """Spend fusion fuel on a candidate the guard accepted: its step number, or (fuel
        exhausted) turn the verdict into a refusal. Refused candidates cost nothing."""
        if not verdict.fuse:
            return None
        step = ledger.spend_fuel()
        if step is None:
            verdict.fuse = False
            verdict.reason, verdict.would_fuse_with = ledger.fuel_refusal()
        return step or None

    def _snapshot(self, groups: list[Group]) -> list[Group]:
        return [g.copy() for g in groups]

    def _restore(self, saved: list[Group]) -> None:
        for g in saved:
            self._groups.pop(self.find(g.gid), None)
        for g in saved:
            self._groups[g.gid] = g
            for m in g.members:
                self._parent[m] = g.gid

    def refuse(self, p: Group, c: Group, reason: str) -> None:
        """Record a structural refusal (no guard numbers apply)."""
        self._record(p, c, False, reason, {}, None, "")

    def gather_via(self, p: Group, c: Group) -> str | None:
        """Why ``c`` cannot take ``p`` in: a member of ``c`` gathers (reads at
        data-dependent positions, or an element through a tensor.extract between ops) a
        tensor a member of ``p`` computes, which must be complete before the gather starts;
        None if none does."""
        # Walk the few nodes that gather, not p's results: a set of those made every
        # merge of a long chain cost O(n) per call, O(n^2) per pass (7.5 s of a
        # 10,000-op chain's 10 s of planning).
        pc, cc = self.find(p.gid), self.find(c.gid)
        for m in self._gatherers:
            if self.find(m) != cc:
                continue
            node = self.graph.nodes[m]
            for v in node.gathers:
                made_by = self.graph.producer.get(v)
                if made_by is not None and self.find(made_by) == pc:
                    return (f"gathers from its producer's result: {node.label} reads "
                            f"{self.graph.nodes[made_by].label} at "
                            "data-dependent positions")
        return None

    def cycle_via(self, p: Group, c: Group) -> str | None:
        """A node outside p and c on a path p -> ... -> c, or None. Nodes after c's last
        member cannot reach c (edges go forward), which bounds the search."""
        stack = [r for v in p.outputs for r in self.graph.readers(v)]
        seen: set[int] = set()
        while stack:
            n = stack.pop()
            g = self.group(n)
            if g is p or g.gid in seen or g.first > c.last:
                continue
            if g is c:
                continue
            seen.add(g.gid)
            for v in g.outputs:
                for r in self.graph.readers(v):
                    if self.group(r) is c:
                        return self.graph.nodes[g.first].label
                    stack.append(r)
        return None

    # ----- write back ------------------------------------------------------------------
    def write_back(self) -> None:
        """Record every multi-op group in the IR, and every single op whose kind a pass
        set (a lone column reduction is a ``columns`` kernel, which its op alone does not
        tell); other singletons carry no attributes."""
        ctx = self.graph.func.context
        i64 = ir.IntegerType.get_signless(64, ctx)
        gid = 0
        for g in self.groups():
            members = sorted(g.members)
            for m in members:
                attrs = self.graph.nodes[m].op.attributes
                for name in (GROUP_ATTR, KIND_ATTR):
                    if name in attrs:
                        del attrs[name]
            if len(members) < 2 and g.forced_kind is None:
                continue
            for m in members:
                self.graph.nodes[m].op.attributes[GROUP_ATTR] = ir.IntegerAttr.get(i64, gid)
            root = self.graph.nodes[root_of(self.graph, g)].op
            root.attributes[KIND_ATTR] = ir.StringAttr.get(g.kind, ctx)
            gid += 1

    # ----- internals -------------------------------------------------------------------
    def _singletons(self) -> list[Group]:
        """A group of its own for every node: copies of groups made once per graph, which
        later passes of the run reuse (graph.func_graph), as the planners of those passes
        would make them again."""
        made = self.graph.derived.get("singletons")
        if made is None:
            made = self.graph.derived["singletons"] = [self._singleton(n) for n in self.graph.nodes]
        return [g.copy() for g in made]

    def _singleton(self, node: Node) -> Group:
        reads = {v: node.read_bytes(v) for v in node.reads}
        outputs = {v: value_bytes(v) for v in node.results if self._escapes(v, node.index)}
        info = node.info
        return Group(node.index, [node.index], reads, outputs, info.flops, _payload_peak(node),
                     info.result_elem_bytes, {info.kind}, node.index, node.index,
                     self._domain(node), self._row_domain(node))

    def _domain(self, node: Node) -> tuple[int, ...]:
        if node.kind in (OpKind.REDUCTION, OpKind.CONTRACTION, OpKind.CONVOLUTION):
            return tuple(node.info.domain)
        return tuple(_shape(node.results[0].type)) if node.results else ()

    def _row_domain(self, node: Node) -> tuple[int, ...] | None:
        """For a reduction over trailing dims, the kept (row) dims; else None."""
        if node.kind != OpKind.REDUCTION:
            return None
        its = node.info.iterators
        n_par = its.count("parallel")
        if any(i != "parallel" for i in its[:n_par]):
            return None
        return tuple(node.info.domain[:n_par])

    def _escapes(self, v: ir.Value, node_index: int) -> bool:
        """Whether ``v`` is returned or read by a node other than ``node_index``."""
        if v in self.graph.returned:
            return True
        return any(r != node_index for r in self.graph.readers(v))

    def _only_read_by(self, v: ir.Value, p: Group, c: Group) -> bool:
        if v in self.graph.returned:
            return False
        return all(self.group(r) in (p, c) for r in self.graph.readers(v))

    def _preview(self, p: Group, c: Group) -> Group:
        reads = dict(c.reads)
        for v, b in self._reads_for(p, c).items():
            reads[v] = _both_parts(v, b, reads[v]) if v in reads else b
        for v in p.outputs:
            reads.pop(v, None)
        outputs = dict(c.outputs)
        for v, b in p.outputs.items():
            if not self._only_read_by(v, p, c):
                outputs[v] = b
        # While c's part runs, the k values it takes from p are live instead of loaded.
        k = sum(1 for v in p.outputs if v in c.reads)
        return Group(c.gid, [], reads, outputs, p.flops + c.flops, max(p.peak, c.peak + k),
                     max(p.elem_bytes, c.elem_bytes), p.kinds | c.kinds)

    def _reads_for(self, p: Group, c: Group) -> dict[ir.Value, int]:
        """What ``p`` reads once it runs inside ``c``. Data movement (transposes, reshapes,
        slices, broadcasts) reads at most one input element per element it writes, so a
        movers-only ``p`` whose results only ``c`` reads, and only part of them (through
        a slice), reads at most that many bytes of its inputs: a head split followed by
        the rotary half of it reads that half, not the whole QKV projection."""
        if not p.kinds <= _MOVERS or not p.outputs:
            return p.reads
        if any(not self._only_read_by(v, p, c) for v in p.outputs):
            return p.reads
        needed = sum(c.reads.get(v, b) for v, b in p.outputs.items())
        return {v: min(b, needed) for v, b in p.reads.items()}

    def _union(self, p: Group, c: Group, merged: Group | None = None) -> Group:
        """Merge ``p`` into ``c``; ``merged`` is their preview when the caller has it."""
        if p is c:
            return c
        if merged is None:
            merged = self._preview(p, c)
        # from p and c as they are: ``big`` is one of them and is updated below
        domain, row_domain = _merged_domain(p, c)
        big, small = (p, c) if len(p.members) >= len(c.members) else (c, p)
        big.members.extend(small.members)
        big.reads, big.outputs = merged.reads, merged.outputs
        big.flops, big.peak, big.elem_bytes = merged.flops, merged.peak, merged.elem_bytes
        big.kinds = merged.kinds
        big.first, big.last = min(p.first, c.first), max(p.last, c.last)
        big.domain, big.row_domain = domain, row_domain
        big.forced_kind = p.forced_kind or c.forced_kind
        self._parent[small.gid] = big.gid
        del self._groups[small.gid]
        return big

    def _record(self, p: Group, c: Group, fused: bool, reason: str, numbers: dict,
                would: str | None, why: str, consumer: Node | None = None,
                producer: str | None = None, step: int | None = None) -> None:
        prod = producer or self.graph.nodes[p.last].label
        cons_node = consumer or self._consumer_node(p, c)
        ledger.record(ledger.Decision(
            pass_name=self.pass_name,
            producer=prod,
            consumer=cons_node.label,
            location=cons_node.location,
            fused=fused,
            reason=reason,
            action=why or "merge",
            numbers=numbers,
            would_fuse_with=would,
            step=step,
        ))

    def _consumer_node(self, p: Group, c: Group) -> Node:
        """The first node of c that reads a value of p (the natural place for a remark)."""
        best = None
        for v in p.outputs:
            for r in self.graph.readers(v):
                if self.group(r) is c and (best is None or r < best):
                    best = r
        return self.graph.nodes[best if best is not None else c.first]


def _merged_domain(p: Group, c: Group) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """A group iterates over the domain of its contraction, else of its reductions, else of
    its consumer side (an injective producer adapts to the consumer's domain)."""
    for kind in (OpKind.CONTRACTION, OpKind.CONVOLUTION, OpKind.REDUCTION, OpKind.SCAN,
                 OpKind.SCATTER):
        for side in (c, p):
            if kind in side.kinds:
                return side.domain, side.row_domain if side.row_domain is not None else (p.row_domain or c.row_domain)
    return c.domain, None


def _both_parts(v: ir.Value, a: int, b: int) -> int:
    """Bytes of ``v`` read by two parts of one kernel that read ``a`` and ``b`` bytes of it:
    all of it if either reads all of it; else (two slices, two gathers) at most both parts."""
    whole = value_bytes(v)
    return whole if max(a, b) >= whole else min(whole, a + b)


def _payload_peak(node: Node) -> int:
    """Peak number of payload temporaries live at once (loads are counted by the group)."""
    if node.info.peak is None:
        node.info.peak = _compute_peak(node)
    return node.info.peak


def _compute_peak(node: Node) -> int:
    p = node.info.payload
    if p is None:
        return 1
    last_use: dict[int, int] = {}
    base = p.n_inputs + p.n_outputs
    for pos, (_, operands, _) in enumerate(p.ops):
        for o in operands:
            last_use[o] = pos
    for o in p.yields:
        last_use[o] = len(p.ops)
    live = peak = 0
    next_id = base
    for pos, (_, operands, n_res) in enumerate(p.ops):
        live += n_res
        peak = max(peak, live)
        for o in set(operands):
            if o >= base and last_use.get(o) == pos:
                live -= 1
        for k in range(n_res):
            if next_id + k not in last_use:
                live -= 1
        next_id += n_res
    return max(1, peak)
