"""The cost model's register estimate against ptxas -v on the kernels opfuse generates.

The guard decides with the estimate (R_fused < R_limit); `--measure-registers` replaces it
with ptxas's figure. This keeps the estimate honest: for each kernel of G1, G2, G3, G4 and
G8 (full size, sm_90) it must be within TOLERANCE registers of the measurement.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from opfuse import ir as oir
from opfuse.backends.gpu.lower import ptxas as ptxas_mod
from opfuse.driver.compile import program
from opfuse.pipeline import Pipeline

EXAMPLES = Path(__file__).parents[2] / "examples"
TOLERANCE = 12
GRAPHS = ["g1_mlp", "g2_elementwise_chain", "g3_softmax", "g4_layernorm", "g8_x_minus_mean"]


@pytest.mark.skipif(ptxas_mod.find_ptxas() is None, reason="ptxas is not installed (pip install 'opfuse[ptxas]')")
@pytest.mark.parametrize("name", GRAPHS)
def test_estimate_is_within_tolerance_of_ptxas(name):
    module = oir.load(str(EXAMPLES / f"{name}.mlir"))
    Pipeline.default().run(module)
    estimates = {}
    for op in module.body.operations:
        attrs = op.operation.attributes
        if "opfuse.kernel" in attrs:
            estimates[attrs["sym_name"].value] = attrs["opfuse.registers"].value
    measured = {k.name: k.resources["sm_90"]["registers"]
                for k in program(module, ("sm_90",), ptxas=True).kernels.values()}
    assert measured and set(measured) == set(estimates)
    for kernel, regs in measured.items():
        assert abs(estimates[kernel] - regs) <= TOLERANCE, (kernel, estimates[kernel], regs)
