// Regression (found by test_random_linalg.py, seed 144): a reduction with two results of
// which only one is used (the rows emitter computes that one) made invalid IR, exit 2,
// when the unused result's payload reads its accumulator: the payload was evaluated in full
// up to the used result's combiner ("'vector.broadcast' op using value defined outside the
// region"). Only the ops the combiner's operands come from are evaluated now.
// Numerics (emulator): test_random_program_regressions.py.
// RUN: fuse-opt %s --emit=kernels | filecheck %s
// CHECK: func.func @fusion_0_input
// CHECK: arith.minimumf
// CHECK-NOT: math.log
func.func @main(%x: tensor<8xf32>, %acc: tensor<f32>) -> tensor<f32> {
  %three = arith.constant 3.0 : f32
  %e = tensor.empty() : tensor<f32>
  %init = linalg.fill ins(%three : f32) outs(%e : tensor<f32>) -> tensor<f32>
  %r:2 = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> ()>, affine_map<(d0) -> ()>], iterator_types = ["reduction"]} ins(%x : tensor<8xf32>) outs(%acc, %init : tensor<f32>, tensor<f32>) {
  ^bb0(%in: f32, %sum: f32, %low: f32):
    %sq = arith.mulf %in, %in : f32
    %l = math.log %sq : f32
    %s = arith.addf %sum, %l : f32
    %m = arith.minimumf %low, %in : f32
    linalg.yield %s, %m : f32, f32
  } -> (tensor<f32>, tensor<f32>)
  return %r#1 : tensor<f32>
}
