// Regression (issue #10): opfuse-fuse-producer-consumer segfaulted on a collapse_shape ->
// expand_shape chain whose results both have several consumers: after duplicating the
// collapse it read the erased op through the stale graph. Duplication now runs in rounds,
// re-planning after each: every consumer gets its own copy of the chain.
// RUN: fuse-opt %s --opfuse-fuse-producer-consumer --opfuse-report=text | filecheck %s
// CHECK: kernels: 6 -> 4
// RUN: fuse-run %s --repeat 0 | filecheck %s --check-prefix=EXEC
// EXEC: #3 {{.*}} ok
#map = affine_map<(d0, d1) -> (d0, d1)>
#m1 = affine_map<(d0) -> (d0)>
func.func @main(%x: tensor<4x8xf32>) -> (tensor<32xf32>, tensor<32xf32>, tensor<4x8xf32>, tensor<4x8xf32>) {
  %c = tensor.collapse_shape %x [[0, 1]] : tensor<4x8xf32> into tensor<32xf32>
  %x2 = tensor.expand_shape %c [[0, 1]] output_shape [4, 8] : tensor<32xf32> into tensor<4x8xf32>
  %e1 = tensor.empty() : tensor<32xf32>
  %a = linalg.generic {indexing_maps = [#m1, #m1], iterator_types = ["parallel"]} ins(%c : tensor<32xf32>) outs(%e1 : tensor<32xf32>) {
  ^bb0(%i: f32, %o: f32):
    %t = math.exp %i : f32
    linalg.yield %t : f32
  } -> tensor<32xf32>
  %b = linalg.generic {indexing_maps = [#m1, #m1], iterator_types = ["parallel"]} ins(%c : tensor<32xf32>) outs(%e1 : tensor<32xf32>) {
  ^bb0(%i: f32, %o: f32):
    %t = math.sin %i : f32
    linalg.yield %t : f32
  } -> tensor<32xf32>
  %e2 = tensor.empty() : tensor<4x8xf32>
  %p = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%x2 : tensor<4x8xf32>) outs(%e2 : tensor<4x8xf32>) {
  ^bb0(%i: f32, %o: f32):
    %t = math.cos %i : f32
    linalg.yield %t : f32
  } -> tensor<4x8xf32>
  %q = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%x2 : tensor<4x8xf32>) outs(%e2 : tensor<4x8xf32>) {
  ^bb0(%i: f32, %o: f32):
    %t = math.tanh %i : f32
    linalg.yield %t : f32
  } -> tensor<4x8xf32>
  return %a, %b, %p, %q : tensor<32xf32>, tensor<32xf32>, tensor<4x8xf32>, tensor<4x8xf32>
}
