"""Regenerates the torch-mlir outputs next to this file (not run by the tests).

They are real torch-mlir text, checked in as inputs nobody on the project wrote: the
torch_mlir wheel 20261001 from PyPI (LLVM-24-era linalg), installed into a scratch venv
with ``pip install --no-deps torch-mlir`` next to torch==2.13.0 (torch-mlir is not an opfuse
dependency). Each module is ``torch_mlir.fx.export_and_import(model.eval(), *args,
output_type="linalg-on-tensors", func_name="main")`` printed as is, with a header comment.
The MLIR 22.1.8 bindings opfuse uses parse every file unchanged (no hand fixes).

    python test/Inputs/torch-mlir/export.py test/Inputs/torch-mlir
"""

import sys
from pathlib import Path

import torch
from torch_mlir import fx


class Softmax(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


def layernorm():
    m = torch.nn.LayerNorm(64)
    with torch.no_grad():
        m.weight.uniform_(0.5, 1.5)
        m.bias.uniform_(-0.5, 0.5)
    return m


def conv_relu():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU())


MODELS = {
    "softmax": (Softmax, (32, 64), "torch.softmax(x, dim=-1), x: 32x64"),
    "layernorm": (layernorm, (32, 64), "torch.nn.LayerNorm(64) with random weight and bias, x: 32x64"),
    "conv_relu": (conv_relu, (1, 3, 16, 16), "nn.Conv2d(3, 8, 3, padding=1) + ReLU, x: 1x3x16x16"),
    "conv_grouped": (lambda: torch.nn.Conv2d(8, 8, 3, padding=1, groups=4), (1, 8, 16, 16),
                     "nn.Conv2d(8, 8, 3, padding=1, groups=4), x: 1x8x16x16"),
    "conv_depthwise": (lambda: torch.nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8),
                       (1, 8, 16, 16), "nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8), x: 1x8x16x16"),
}


class LayerNormLinearGelu(torch.nn.Module):
    """LayerNorm(64) -> Linear(64, 32) -> GELU (erf): a transformer MLP's first half."""

    def __init__(self):
        super().__init__()
        self.norm = layernorm()
        self.fc = torch.nn.Linear(64, 32)

    def forward(self, x):
        return torch.nn.functional.gelu(self.fc(self.norm(x)))


# Exported with torch.export Dims: the sizes are ? in the linalg, read with tensor.dim.
BATCH = torch.export.Dim("batch")
DYNAMIC = {
    "softmax_dynamic": (Softmax, (32, 64), {0: BATCH},
                        "torch.softmax(x, dim=-1), x: batch x 64 (batch dynamic)"),
    # batch x 64: with a dynamic seq dim too (batch x seq x 64), this wheel's output is
    # only valid at seq 1 (it writes LayerNorm's product as tensor<?x1x64xf32>), which
    # opfuse's specialization refuses at any other seq, naming the op
    "ln_linear_gelu_dynamic": (LayerNormLinearGelu, (4, 64), {0: BATCH},
                               "LayerNorm(64) -> Linear(64, 32) -> GELU, x: batch x 64 "
                               "(batch dynamic; torch.manual_seed(0) before building)"),
}


def main(folder: str) -> None:
    for name, (make, shape, what) in MODELS.items():
        torch.manual_seed(0)
        model = make().eval()
        module = fx.export_and_import(model, torch.randn(*shape), output_type="linalg-on-tensors",
                                      func_name="main")
        header = (f"// torch-mlir output of {what} (see export.py in this folder: the wheel, the\n"
                  "// call; printed as is, parsed unchanged by the MLIR 22.1.8 bindings).\n")
        Path(folder, f"{name}.mlir").write_text(header + str(module))
    for name, (make, shape, dims, what) in DYNAMIC.items():
        torch.manual_seed(0)
        model = make().eval()
        module = fx.export_and_import(model, torch.randn(*shape), output_type="linalg-on-tensors",
                                      func_name="main", dynamic_shapes={"x": dims})
        header = (f"// torch-mlir output of {what} (see export.py in this folder: the wheel, the\n"
                  "// call; printed as is, parsed unchanged by the MLIR 22.1.8 bindings).\n")
        Path(folder, f"{name}.mlir").write_text(header + str(module))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).parent))
