"""opfuse-fuse-reduction: reductions absorb the loop groups around them ("input" fusion).

Producers: a loop group over the reduction's iteration space is computed while reducing
(reduce while computing), so its result never reaches memory.
Consumers: when the reduction runs over the trailing dims (a row reduction), one kernel
holds whole rows, so loop groups over the row domain (x - mean(x) broadcast back over the
row) or over the reduced domain (mean = sum / n) can run in the same kernel, and so can a
second reduction over the same rows. Softmax, layernorm and x - mean(x) each become one
group. Column reductions take producers only.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir import ir

from opfuse.analysis.groups import Group, Planner
from opfuse.analysis.opinfo import OpKind

from .common import FusionOptions, candidate_pairs, plan_each_function, shape_str

NAME = "opfuse-fuse-reduction"


@dataclass(frozen=True)
class Options(FusionOptions):
    """Guard thresholds, plus:

    Attributes:
        fuse_consumers: also fuse loop groups and reductions after a row reduction.
    """

    fuse_consumers: bool = True


def run(module: ir.Module, options: Options = Options()) -> None:
    plan_each_function(module, NAME, options, lambda planner: _plan(planner, options))


def _has_reduction(g: Group) -> bool:
    return OpKind.REDUCTION in g.kinds


def _compatible(p: Group, c: Group, options: Options) -> str | None:
    """None when p may join c; otherwise why not."""
    roots = ("output", "conv", "scan", "scatter", "opaque")
    if c.kind in roots or p.kind in roots:
        return f"a {p.kind if p.kind in roots else c.kind} group is not fused here"
    if _has_reduction(c) and not _has_reduction(p):
        if p.domain == c.domain:
            return None
        return f"producer iterates over {shape_str(p.domain)}, the reduction over {shape_str(c.domain)}"
    # p holds a reduction: c reads its result, so c must fit in p's row kernel
    if not options.fuse_consumers:
        return "consumer fusion is off (fuse-consumers=0)"
    if p.row_domain is None:
        return "not a row reduction: its consumers need the whole reduction first"
    if _has_reduction(c):
        if c.domain != p.domain:
            return (f"reductions over different domains: {shape_str(p.domain)} vs "
                    f"{shape_str(c.domain)}")
        if c.row_domain != p.row_domain:
            # one row kernel holds one split into rows: a max over every axis and a sum
            # over the last one would leave no emitter but the sequential fallback
            return (f"reductions over different rows: {_rows(p)} vs {_rows(c)} "
                    "of one domain")
        return None
    if c.domain in (p.domain, p.row_domain):
        return None
    return (f"consumer iterates over {shape_str(c.domain)}, not over the rows "
            f"{shape_str(p.domain)} or their results {shape_str(p.row_domain)}")


def _rows(g: Group) -> str:
    """How a reduction group splits its domain: kept dims, then reduced dims."""
    if g.row_domain is None:
        return f"{shape_str(g.domain)} (not a row reduction)"
    if not g.row_domain:
        return f"one row of {shape_str(g.domain)}"
    return f"rows {shape_str(g.row_domain)} of {shape_str(g.domain[len(g.row_domain):])}"


def _glue_chain(planner: Planner, p: Group, c: Group) -> list[Group]:
    """``c`` and the groups it feeds, through any number of glue groups over the reduced
    domain (round to f16, scale by 1/n, add eps, rsqrt), up to the first groups over the
    row domain, in block order. Those are loop groups, or a row kernel over the same rows
    that the glue's value joins (torch-mlir's LayerNorm computes the mean twice: the second
    one's ``x - mean`` is already in the variance's row kernel)."""
    chain, seen, frontier = [c], {c.gid}, [c]
    while frontier:
        g = frontier.pop()
        for d in planner.consumer_groups(g):
            same_rows = _has_reduction(d) and (d.domain, d.row_domain) == (p.domain, p.row_domain)
            if d.gid in seen or not (d.is_loop or same_rows):
                continue
            if d.domain not in (p.domain, p.row_domain):
                continue
            seen.add(d.gid)
            chain.append(d)
            if d.domain == p.row_domain:
                frontier.append(d)
    return _topological(planner, chain)


def _topological(planner: Planner, groups: list[Group]) -> list[Group]:
    """``groups`` producers first (block order among independent ones): a merge chain must
    meet each group after every group of the chain it reads from. Block order alone is not
    enough: a row kernel that ``x - mean`` joined starts before that mean is computed."""
    ids = {g.gid for g in groups}
    preds = {g.gid: {p.gid for p in planner.producer_groups(g) if p.gid in ids} for g in groups}
    out: list[Group] = []
    done: set[int] = set()
    while len(out) < len(groups):
        ready = [g for g in groups if g.gid not in done and preds[g.gid] <= done]
        nxt = min(ready, key=lambda g: g.first)
        out.append(nxt)
        done.add(nxt.gid)
    return out


def _plan(planner: Planner, options: Options) -> None:
    accept = lambda p, c: _has_reduction(p) or _has_reduction(c)  # noqa: E731
    for p, c in candidate_pairs(planner, accept):
        why_not = _compatible(p, c, options)
        if why_not is not None:
            planner.refuse(p, c, why_not)
            continue
        if _has_reduction(p) and not _has_reduction(c) and c.domain == p.row_domain:
            # glue over the reduced domain (mean = sum / n): judged together with the
            # row-domain consumers it feeds, which is what fusing it enables
            planner.try_merge_chain(p, _glue_chain(planner, p, c), why="after reduction")
            continue
        planner.try_merge(p, c, why="into reduction" if _has_reduction(c) else "after reduction")
