// Malformed input for the fusion passes: each chunk is reported at its location, with exit
// code 1 and no traceback, and the other chunks are still processed.
// RUN: %expect-exit 1 fuse-opt %s --split-input-file --opfuse-fuse-elementwise 2>&1 | filecheck %s
// CHECK-NOT: Traceback

// A dynamic entry with no sizes to compile it at (no --dim-size): a clear error at the
// argument's function.
// CHECK: fuse-elementwise-error.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: dynamic shapes are compiled at given sizes (--dim-size N{{.*}}): argument 0 of @dynamic has type tensor<?x4xf32>
func.func @dynamic(%x: tensor<?x4xf32>) -> tensor<?x4xf32> {
  return %x : tensor<?x4xf32>
}

// -----

// ... and at the op that produces one.
func.func @dynamic_result(%x: tensor<8x4xf32>) -> tensor<?x4xf32> {
  // CHECK: fuse-elementwise-error.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: a ? dim inside a function is supported where it follows from a dynamic entry's argument sizes: 'tensor.cast' produces tensor<?x4xf32>
  %0 = tensor.cast %x : tensor<8x4xf32> to tensor<?x4xf32>
  return %0 : tensor<?x4xf32>
}

// -----

// A verifier error in the input: the op's location and MLIR's message.
func.func @mismatched(%x: tensor<8x4xf32>) -> tensor<8x8xf32> {
  %e = tensor.empty() : tensor<8x8xf32>
  // CHECK: fuse-elementwise-error.mlir:[[# @LINE + 1]]:{{[0-9]+}}: error: 'linalg.exp' op
  %0 = linalg.exp ins(%x : tensor<8x4xf32>) outs(%e : tensor<8x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// -----

// A well-formed chunk after the bad ones still fuses.
// CHECK-LABEL: func.func @fine
// CHECK: opfuse.kind = "loop"
func.func @fine(%x: tensor<8x4xf32>) -> tensor<8x4xf32> {
  %e = tensor.empty() : tensor<8x4xf32>
  %0 = linalg.exp ins(%x : tensor<8x4xf32>) outs(%e : tensor<8x4xf32>) -> tensor<8x4xf32>
  %1 = linalg.negf ins(%0 : tensor<8x4xf32>) outs(%e : tensor<8x4xf32>) -> tensor<8x4xf32>
  return %1 : tensor<8x4xf32>
}
