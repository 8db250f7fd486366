// Regression (issue #10): arith/math ops applied to whole tensors failed late (exit 2).
// The input contract rewrites them as linalg.generic (convert-elementwise-to-linalg).
// RUN: fuse-run %s --repeat 0 | filecheck %s
// CHECK: kernels {{ +}}2 {{ +}}1
// CHECK: #0 {{.*}} ok
func.func @main(%x: tensor<4x8xf32>, %y: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %0 = arith.addf %x, %y : tensor<4x8xf32>
  %1 = math.exp %0 : tensor<4x8xf32>
  return %1 : tensor<4x8xf32>
}
