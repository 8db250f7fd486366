// The benchmark graphs' kernel counts under the default pipeline, read from the JSON report.
// RUN: fuse-opt %S/../../examples/g2_elementwise_chain.mlir --opfuse-report=json | filecheck %s --check-prefix=ONE
// RUN: fuse-opt %S/../../examples/g3_softmax.mlir --opfuse-report=json | filecheck %s --check-prefix=ONE
// RUN: fuse-opt %S/../../examples/g4_layernorm.mlir --opfuse-report=json | filecheck %s --check-prefix=ONE
// RUN: fuse-opt %S/../../examples/g8_x_minus_mean.mlir --opfuse-report=json | filecheck %s --check-prefix=ONE
// RUN: fuse-opt %S/../../examples/g1_mlp.mlir --opfuse-report=json | filecheck %s --check-prefix=G1
// RUN: fuse-opt %S/../../examples/g1_mlp.mlir --disable-pass=opfuse-fuse-epilogue --opfuse-report=json | filecheck %s --check-prefix=G1-NOEPI

// G2 (elementwise chain), G3 (softmax), G4 (layernorm) and G8 (x - mean(x)): one kernel.
// ONE: "kernels": [
// ONE-NEXT: {
// ONE: "name": "fusion_0_
// ONE-NOT: "name": "fusion_1_
// ONE: "totals": {
// ONE-NEXT: "after": {
// ONE-NEXT: "bytes":
// ONE-NEXT: "flops":
// ONE-NEXT: "kernels": 1

// G1 (Linear -> GELU -> Linear -> GELU): each bias add with its GELU chain (8 ops, tanh
// form) is the epilogue of its matmul (opfuse-fuse-epilogue): 2 kernels.
// G1: "kind": "output",
// G1-NEXT: "members": [
// G1-NEXT: "fc1",
// G1-NEXT: "fc1.bias",
// G1-NEXT: "gelu1.pow",
// G1-COUNT-6: "gelu1.
// G1-NEXT: "gelu1.mul_3"
// G1: "kind": "output",
// G1-NEXT: "members": [
// G1-NEXT: "fc2",
// G1-NEXT: "fc2.bias",
// G1-COUNT-8: "gelu2.
// G1: "after": {
// G1-NEXT: "bytes":
// G1-NEXT: "flops":
// G1-NEXT: "kernels": 2

// Without epilogue fusion, each matmul is its own kernel and each bias add with its GELU
// chain is one loop kernel: 4 kernels.
// G1-NOEPI: "kind": "output",
// G1-NOEPI-NEXT: "members": [
// G1-NOEPI-NEXT: "fc1"
// G1-NOEPI: "kind": "loop",
// G1-NOEPI-NEXT: "members": [
// G1-NOEPI-NEXT: "fc1.bias",
// G1-NOEPI-NEXT: "gelu1.pow",
// G1-NOEPI-COUNT-6: "gelu1.
// G1-NOEPI-NEXT: "gelu1.mul_3"
// G1-NOEPI: "kind": "output",
// G1-NOEPI: "kind": "loop",
// G1-NOEPI: "after": {
// G1-NOEPI-NEXT: "bytes":
// G1-NOEPI-NEXT: "flops":
// G1-NOEPI-NEXT: "kernels": 4
