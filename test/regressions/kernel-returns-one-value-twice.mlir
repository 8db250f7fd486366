// Regression: folding min(s, s) to s inside a fused kernel made the kernel return one
// buffer twice, and buffer-results-to-out-params crashed the process (segfault). Found by
// test/unit/test_random_dags.py. A host returning an argument, or one value twice, is the
// same situation one level up.
// RUN: fuse-run %s --repeat 0 | filecheck %s
// CHECK: kernels        2 {{ *}} 1
// CHECK: #0 {{.*}} ok
// CHECK: #1 {{.*}} ok
// CHECK: #2 {{.*}} ok
// CHECK: #3 {{.*}} ok
func.func @dag(%x: tensor<3x5xf32>) -> (tensor<3xf32>, tensor<3xf32>, tensor<3x5xf32>, tensor<3xf32>) {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<3xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<3xf32>) -> tensor<3xf32>
  %s = linalg.reduce ins(%x : tensor<3x5xf32>) outs(%f : tensor<3xf32>) dimensions = [1]
    (%in: f32, %acc: f32) {
      %r = arith.addf %in, %acc : f32
      linalg.yield %r : f32
    }
  %m = linalg.min ins(%s, %s : tensor<3xf32>, tensor<3xf32>) outs(%e : tensor<3xf32>) -> tensor<3xf32>
  return %s, %m, %x, %m : tensor<3xf32>, tensor<3xf32>, tensor<3x5xf32>, tensor<3xf32>
}
