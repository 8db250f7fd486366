// Regression (issue #10): a generic whose `outs` is another op's result that it does not
// read made opfuse-outline emit invalid IR ("using value defined outside the region",
// exit 2): the analysis follows reads, so the two ops were outlined separately and the
// operand stayed behind in the first kernel. The input contract makes such an operand a
// tensor.empty (it only names the result's shape).
// RUN: fuse-opt %s --opfuse-outline | filecheck %s
// CHECK-COUNT-2: func.func private @fusion_
// RUN: fuse-run %s --repeat 0 | filecheck %s --check-prefix=EXEC
// EXEC: #0 {{.*}} ok
#map = affine_map<(d0, d1) -> (d0, d1)>
func.func @main(%x: tensor<4x8xf32>, %y: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %e = tensor.empty() : tensor<4x8xf32>
  %0 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%x : tensor<4x8xf32>) outs(%e : tensor<4x8xf32>) {
  ^bb0(%a: f32, %o: f32):
    %t = math.exp %a : f32
    linalg.yield %t : f32
  } -> tensor<4x8xf32>
  %1 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%y : tensor<4x8xf32>) outs(%0 : tensor<4x8xf32>) {
  ^bb0(%a: f32, %o: f32):
    %t = arith.addf %a, %a : f32
    linalg.yield %t : f32
  } -> tensor<4x8xf32>
  return %1 : tensor<4x8xf32>
}
