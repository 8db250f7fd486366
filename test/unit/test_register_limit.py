"""A kernel ptxas spills at an occupancy of its own choosing is assembled again with
``.maxnreg`` (backends/gpu/compiler.py ``_without_spills``, lower/ptxas.py
``with_register_limit``).

Without a limit in the PTX, ptxas sizes a kernel for an occupancy it derives from
``.maxntid`` and may spill to reach it, though a thread could have more registers: the
input here is Llama's training backward dQ/dK pair (a SIMT horizontal kernel, 8 x 8 x 8
per batch), 80 registers and 12 spill bytes on sm_90 where it needs 107; the small CNN's
BatchNorm-backward column kernel, 72 registers and 56 spill bytes on sm_80 where it
needs 119. Kernels that do not spill keep ptxas's choice."""

from __future__ import annotations

from pathlib import Path

import pytest

from opfuse.backends.gpu import compiler
from opfuse.backends.gpu.lower import ptxas
from opfuse.runtime.schedule import KernelSpec

PTX = Path(__file__).parent / "Inputs" / "spills_at_ptxas_occupancy.ptx"
ENTRY = "fusion_14_horizontal_kernel"

TWO_ENTRIES = """\
.version 7.8
.target sm_90
.address_size 64
.visible .entry first(
\t.param .u64 first_param_0
)
.maxntid 32, 1, 1
{
\tret;
}
.visible .entry second(
\t.param .u64 second_param_0
)
.maxntid 256, 1, 1
{
\tret;
}
"""


def test_the_limit_goes_on_the_named_entry_only():
    limited = ptxas.with_register_limit(TWO_ENTRIES, "second", 255)
    lines = limited.splitlines()
    at = lines.index(".maxnreg 255")
    assert lines[at - 1] == ".maxntid 256, 1, 1" and lines[at + 1] == "{"
    assert limited.count(".maxnreg") == 1 and lines.index(".maxntid 32, 1, 1") < at
    assert limited.replace(".maxnreg 255\n", "") == TWO_ENTRIES


def test_a_limited_or_unknown_entry_is_left_alone():
    limited = ptxas.with_register_limit(TWO_ENTRIES, "first", 128)
    assert ptxas.with_register_limit(limited, "first", 255) is None
    assert ptxas.with_register_limit(TWO_ENTRIES, "third", 255) is None


def _spec() -> KernelSpec:
    return KernelSpec("fusion_14_horizontal", ENTRY, "horizontal", [], (2, 1, 8), (16, 16, 1), 0)


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not installed")
def test_a_kernel_ptxas_spills_is_assembled_again_without_spills():
    exe = ptxas.find_ptxas()
    text = PTX.read_text()
    _, parsed = ptxas.assemble(text, "sm_90", ptxas=exe, name="plain",
                               options=compiler.PTXAS_OPTIONS)
    plain = parsed[ENTRY].to_json()
    again = compiler._without_spills(_spec(), text, "sm_90", exe, {ENTRY: plain})
    if not (plain["spill_stores"] or plain["spill_loads"]):
        assert again is None  # this ptxas does not spill it: nothing to redo
        return
    ptx, cubin, res, limit = again
    assert ".maxnreg 255" in ptx and cubin
    assert res[ENTRY]["spill_stores"] == res[ENTRY]["spill_loads"] == 0
    assert res[ENTRY]["registers"] > plain["registers"]
    assert limit == {"limit": 255, "unlimited_registers": plain["registers"],
                     "unlimited_spill_bytes": plain["spill_stores"] + plain["spill_loads"]}


@pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not installed")
def test_a_kernel_without_spills_keeps_ptxas_choice():
    exe = ptxas.find_ptxas()
    plain = ptxas.with_register_limit(PTX.read_text(), ENTRY, 128)  # ptxas needs 107 here
    _, parsed = ptxas.assemble(plain, "sm_90", ptxas=exe, name="plain",
                               options=compiler.PTXAS_OPTIONS)
    res = parsed[ENTRY].to_json()
    assert res["spill_stores"] == 0
    assert compiler._without_spills(_spec(), plain, "sm_90", exe, {ENTRY: res}) is None
