// RUN: fuse-opt %s --opfuse-fuse-elementwise --opfuse-fuse-recompute | filecheck %s
// RUN: fuse-opt %s --opfuse-fuse-elementwise --opfuse-fuse-recompute --opfuse-remarks 2>&1 >/dev/null | filecheck %s --check-prefix=REMARK

// A scalar loop group (a = s * 2, b = 1 / a) whose second op comes after the first
// reader of the first (y = x + a): opfuse-fuse-recompute cloned the whole group in front
// of that reader, so b's copy read its tensor.empty before its definition ("operand does
// not dominate this use", an internal error that left Adam's step eager). The group is
// not cloned where it cannot go; the module verifies.
// CHECK-LABEL: func.func @scalars_around_their_reader
// CHECK: return
// REMARK: remark: [opfuse-fuse-recompute] not fused: b -> y: b reads values defined after its first reader y: no copy can go there
#s = affine_map<(d0) -> ()>
#v = affine_map<(d0) -> (d0)>
#z = affine_map<() -> ()>
func.func @scalars_around_their_reader(%s: tensor<f32>, %x: tensor<1024xf32>) -> tensor<1024xf32> {
  %e0 = tensor.empty() : tensor<f32>
  %a = linalg.generic {indexing_maps = [#z, #z], iterator_types = []} ins(%s : tensor<f32>) outs(%e0 : tensor<f32>) {
  ^bb0(%i: f32, %o: f32):
    %two = arith.constant 2.0 : f32
    %m = arith.mulf %i, %two : f32
    linalg.yield %m : f32
  } -> tensor<f32> loc("a")
  %e1 = tensor.empty() : tensor<1024xf32>
  %y = linalg.generic {indexing_maps = [#v, #s, #v], iterator_types = ["parallel"]} ins(%x, %a : tensor<1024xf32>, tensor<f32>) outs(%e1 : tensor<1024xf32>) {
  ^bb0(%i: f32, %j: f32, %o: f32):
    %r = arith.addf %i, %j : f32
    linalg.yield %r : f32
  } -> tensor<1024xf32> loc("y")
  %e2 = tensor.empty() : tensor<f32>
  %b = linalg.generic {indexing_maps = [#z, #z], iterator_types = []} ins(%a : tensor<f32>) outs(%e2 : tensor<f32>) {
  ^bb0(%i: f32, %o: f32):
    %one = arith.constant 1.0 : f32
    %r = arith.divf %one, %i : f32
    linalg.yield %r : f32
  } -> tensor<f32> loc("b")
  %e3 = tensor.empty() : tensor<1024xf32>
  %z = linalg.generic {indexing_maps = [#v, #s, #v], iterator_types = ["parallel"]} ins(%y, %b : tensor<1024xf32>, tensor<f32>) outs(%e3 : tensor<1024xf32>) {
  ^bb0(%i: f32, %j: f32, %o: f32):
    %r = arith.mulf %i, %j : f32
    linalg.yield %r : f32
  } -> tensor<1024xf32> loc("z")
  return %z : tensor<1024xf32>
}
