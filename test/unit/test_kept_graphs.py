"""Function graphs kept from pass to pass within one pipeline run (``graph.func_graph``).

A graph is reused while the function has the same ops, with the groups read again (the one
thing the fusion passes change); a new one is built after ops are added or erased, or
after ``forget_graphs`` (a use replaced in place). With ``OPFUSE_CHECK_ANALYSES`` set (the
test session sets it, conftest.py) a reused graph is compared with a fresh build, so a
pass that rewires ops without saying so fails with an internal error.
"""

from __future__ import annotations

import pytest
from mlir import ir

from opfuse import ir as oir
from opfuse.analysis.graph import GROUP_ATTR, func_graph, functions
from opfuse.analysis.opinfo import forget, forget_graphs, info_cache
from opfuse.builder import Graph
from opfuse.errors import EXIT_INTERNAL_ERROR, OpfuseError
from opfuse.pipeline import Pipeline


def _module() -> ir.Module:
    g = Graph("f")
    x, b = g.input("x", (4, 8)), g.input("b", (8,))
    y = g.tanh(x * b)
    g.output(g.relu(y) + y)
    return oir.parse_module(g.to_mlir())


def test_a_graph_is_kept_while_the_function_has_the_same_ops():
    module = _module()
    func_op = functions(module)[0]
    with info_cache():
        first = func_graph(func_op)
        assert all(n.group is None for n in first.nodes)
        op = first.nodes[0].op
        op.attributes[GROUP_ATTR] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64, op.context), 7)
        again = func_graph(func_op)
        assert again is first and again.nodes[0].group == 7  # the group is read again
    with info_cache():  # another pipeline run
        assert func_graph(func_op) is not first


def test_a_graph_is_built_again_after_ops_are_erased_or_rewired():
    module = _module()
    func_op = functions(module)[0]
    with info_cache():
        graph = func_graph(func_op)
        tanh, relu = graph.nodes[1], graph.nodes[2]
        relu.op.replace_uses_of_with(tanh.results[0], tanh.op.operands[0])  # relu(x * b)
        forget_graphs()
        rewired = func_graph(func_op)
        assert rewired is not graph and rewired.nodes[2].reads[0] == graph.nodes[0].results[0]
        add = rewired.nodes[3]
        add.op.replace_uses_of_with(tanh.results[0], tanh.op.operands[0])
        forget(tanh.op)
        tanh.op.erase()
        assert [n.op.name for n in func_graph(func_op).nodes] == ["linalg.generic"] * 3


def test_a_use_replaced_without_saying_so_is_an_internal_error(monkeypatch):
    monkeypatch.setenv("OPFUSE_CHECK_ANALYSES", "1")
    module = _module()
    func_op = functions(module)[0]
    with info_cache():
        graph = func_graph(func_op)
        tanh, relu = graph.nodes[1], graph.nodes[2]
        relu.op.replace_uses_of_with(tanh.results[0], tanh.op.operands[0])
        with pytest.raises(OpfuseError, match=r"graph of @f kept from an earlier pass is stale: "
                                              r"node 0 .*users changed") as e:
            func_graph(func_op)
        assert e.value.exit_code == EXIT_INTERNAL_ERROR


def test_the_planning_passes_of_one_run_share_one_graph(monkeypatch):
    """elementwise -> producer-consumer -> reduction build the graph once; the decisions are
    those of graphs built per pass (checked by the session's OPFUSE_CHECK_ANALYSES)."""
    import opfuse.analysis.graph as graph_mod

    built = []
    original = graph_mod.FuncGraph.__init__

    def counting(self, *args, **kwargs):
        built.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(graph_mod.FuncGraph, "__init__", counting)
    monkeypatch.delenv("OPFUSE_CHECK_ANALYSES")  # (its fresh builds would count)
    module = _module()
    pipeline = ("builtin.module(opfuse-fuse-elementwise,opfuse-fuse-producer-consumer,"
                "opfuse-fuse-reduction)")
    ledger = Pipeline.parse(pipeline).run(module)
    assert len(built) == 1
    assert any(d.fused for d in ledger.decisions)
