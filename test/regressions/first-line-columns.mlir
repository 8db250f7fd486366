// Regression (issue #10): in a file without `module {`, errors on the line of the first op
// were reported 8 columns to the right (the parser wraps the ops in "module {" on that
// line). Parse errors and later diagnostics now give the file's columns.
// RUN: %expect-exit 1 fuse-opt %s --split-input-file 2>&1 | filecheck %s
// CHECK: first-line-columns.mlir:[[# @LINE + 1]]:60: error: custom op 'arith.bogus' is unknown
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> { %0 = arith.bogus %x : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// CHECK: first-line-columns.mlir:[[# @LINE + 1]]:1: error: dynamic shapes are compiled at given sizes (--dim-size N{{.*}}): argument 0 of @dynamic
func.func @dynamic(%x: tensor<?xf32>) -> tensor<?xf32> {
  return %x : tensor<?xf32>
}
