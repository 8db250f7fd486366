// Regression (found by test_random_linalg.py, seed 702 of the 1500): opfuse-fold-unit-dims
// rewrites a fill whose outs is an argument (harmless: the contract leaves arguments) to
// fill a collapse_shape of it, an op of its own; the fill is cloned into the reduction's
// kernel, and outlining left the reshape in another one: invalid IR, exit 2. The fold now
// gives unread outs a tensor.empty again, as the contract does. Numerics:
// test_random_program_regressions.py.
// RUN: fuse-run %s | filecheck %s
// CHECK: #0{{ +}}tensor<1xf32>{{.*}}ok
func.func @main(%acc: tensor<1xf32>, %x: tensor<4xf32>) -> tensor<1xf32> {
  %half = arith.constant 0.5 : f32
  %f = linalg.fill ins(%half : f32) outs(%acc : tensor<1xf32>) -> tensor<1xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (0)>, affine_map<(d0, d1) -> (d1)>, affine_map<(d0, d1) -> (d0)>], iterator_types = ["parallel", "reduction"]} ins(%acc, %x : tensor<1xf32>, tensor<4xf32>) outs(%f : tensor<1xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %s = arith.addf %a, %b : f32
    %m = arith.maximumf %o, %s : f32
    linalg.yield %m : f32
  } -> tensor<1xf32>
  return %r : tensor<1xf32>
}
