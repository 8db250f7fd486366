// Regression (issue #11): a fill written as a linalg.generic (no inputs, a body that yields
// a value from outside it: what the unit-dim fold makes of an iota over a size-1 dim) was
// left in the host function and passed to the kernel as an argument, which the GPU backend
// refuses ("'linalg.generic' in the host function"). It is a free op: each kernel that reads
// it gets a copy, with the constant its body captures.
// RUN: fuse-opt %s | filecheck %s
// CHECK-LABEL: func.func private @fusion_0_loop
// CHECK: arith.constant 2.5
// CHECK: linalg.generic
// CHECK-NOT: ins(
// CHECK: linalg.yield %cst
// CHECK-LABEL: func.func @main
// CHECK-NOT: linalg.generic
// CHECK: call @fusion_0_loop(%arg0)
// CHECK-NOT: linalg.generic
#id = affine_map<(d0) -> (d0)>
func.func @main(%x: tensor<77xf32>) -> tensor<77xf32> {
  %c = arith.constant 2.5 : f32
  %e = tensor.empty() : tensor<77xf32>
  %fill = linalg.generic {indexing_maps = [#id], iterator_types = ["parallel"]} outs(%e : tensor<77xf32>) {
  ^bb0(%out: f32):
    linalg.yield %c : f32
  } -> tensor<77xf32>
  %r = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel"]} ins(%x, %fill : tensor<77xf32>, tensor<77xf32>) outs(%e : tensor<77xf32>) {
  ^bb0(%a: f32, %b: f32, %out: f32):
    %s = arith.addf %a, %b : f32
    linalg.yield %s : f32
  } -> tensor<77xf32>
  return %r : tensor<77xf32>
}
