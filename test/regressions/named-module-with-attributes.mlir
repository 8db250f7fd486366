// Regression (issue #10): a named module with attributes, as IREE and torch-mlir print
// them, crashed fuse-run and opfuse.compile with exit 2 (AttributeError in the CPU
// lowering's module copy); fuse-opt was fine. The name and attributes now survive every copy.
// RUN: fuse-run %s --repeat 0 | filecheck %s
// CHECK: #0 {{.*}} ok
// RUN: fuse-opt %s | filecheck %s --check-prefix=OPT
// OPT: module @m attributes {torch.debug_module_name = "M"}
// RUN: fuse-opt %s --emit=ptx | filecheck %s --check-prefix=PTX
// PTX: .entry
module @m attributes {torch.debug_module_name = "M"} {
  func.func @main(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
    %e = tensor.empty() : tensor<4x8xf32>
    %0 = linalg.exp ins(%x : tensor<4x8xf32>) outs(%e : tensor<4x8xf32>) -> tensor<4x8xf32>
    %1 = linalg.negf ins(%0 : tensor<4x8xf32>) outs(%e : tensor<4x8xf32>) -> tensor<4x8xf32>
    return %1 : tensor<4x8xf32>
  }
}
