// Regression (issue #10): with a function argument as the `outs` operand of an op that
// reads it, the CPU backend wrote into the caller's array: the fused run overwrote %c,
// the unfused run then saw the new values and fuse-run reported a mismatch that was not
// one (and a second call returned 2*a@b + c). The argument is now copied first (and the
// report counts the copy); test/unit/test_read_only_inputs.py covers every backend.
// RUN: fuse-run %s --repeat 2 | filecheck %s
// CHECK: input copies {{ +}}128 B {{ +}}128 B
// CHECK: #0 {{.*}} ok
// RUN: fuse-opt %s --opfuse-report=text | filecheck %s --check-prefix=REPORT
// REPORT: input copies: 128 B on the cpu backend
func.func @main(%a: tensor<4x3xf32>, %b: tensor<3x4xf32>, %c: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %0 = linalg.matmul ins(%a, %b : tensor<4x3xf32>, tensor<3x4xf32>) outs(%c : tensor<4x4xf32>) -> tensor<4x4xf32>
  return %0 : tensor<4x4xf32>
}
