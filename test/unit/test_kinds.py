"""The group-kind registry (opfuse.kinds) is the one list of kinds: its readers agree."""

from __future__ import annotations

from opfuse import kinds
from opfuse.analysis import groups
from opfuse.analysis.opinfo import OpKind
from opfuse.backends.gpu import compiler
from opfuse.report import graphview, schema


def test_every_reader_lists_the_registry_kinds():
    names = list(kinds.KINDS)
    assert list(graphview.KINDS) == names
    assert set(graphview.KIND_COLORS) == {*names, "none"}
    assert list(compiler.ORDER) == names
    assert set(groups.FORCED_KINDS) == {"attention", "horizontal", "columns"}


def test_the_schema_enum_comes_from_the_registry():
    # The file's enum once lacked "columns": a report with a column kernel did not validate.
    enum = schema.load_schema()["$defs"]["kernel"]["properties"]["kind"]["enum"]
    assert enum == list(kinds.KINDS)
    assert "columns" in enum


def test_every_emitter_named_exists_and_fallback_is_last():
    for kind in kinds.KINDS.values():
        assert set(kind.emitters) <= set(compiler.EMITTERS), kind.name
        assert kind.emitters[-1] == "fallback", kind.name


def test_op_classes_are_opinfo_values():
    values = {k.value for k in OpKind}
    for kind in kinds.KINDS.values():
        assert kind.root is None or kind.root in values
        assert kind.derived_from is None or kind.derived_from in values
    assert all(kinds.KINDS[k].derived_from for k in kinds.DERIVATION)


def test_derivation_order_on_hand_made_sets():
    assert kinds.derive(set()) == "loop"
    assert kinds.derive({"elementwise", "broadcast"}) == "loop"
    assert kinds.derive({"reduction", "elementwise"}) == "input"
    assert kinds.derive({"contraction", "reduction"}) == "output"
    assert kinds.derive({"convolution", "contraction"}) == "conv"
    assert kinds.derive({"scan", "convolution"}) == "scan"
    assert kinds.derive({"opaque", "scan", "contraction"}) == "opaque"


def test_an_unknown_kind_names_the_known_ones():
    import pytest

    with pytest.raises(KeyError, match="known: loop, input"):
        kinds.get("vertical")
