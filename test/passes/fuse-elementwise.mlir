// RUN: fuse-opt %s --split-input-file --opfuse-fuse-elementwise | filecheck %s
// RUN: fuse-opt %s --split-input-file --opfuse-fuse-elementwise --opfuse-remarks 2>&1 >/dev/null | filecheck %s --check-prefix=REMARK
// RUN: fuse-opt %s --split-input-file --opfuse-fuse-elementwise="delta=0.9" --opfuse-remarks 2>&1 >/dev/null | filecheck %s --check-prefix=DELTA
// RUN: fuse-opt %s --split-input-file --opfuse-fuse-elementwise="r-limit=16" --opfuse-remarks 2>&1 >/dev/null | filecheck %s --check-prefix=RLIMIT

#id = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d1)>

// A chain of three elementwise ops (one reading a broadcast row vector) is one loop group.
// CHECK-LABEL: func.func @chain
// CHECK: linalg.generic
// CHECK-SAME: opfuse.group = 0
// CHECK: linalg.generic
// CHECK-SAME: opfuse.group = 0
// CHECK: linalg.generic
// CHECK-SAME: opfuse.group = 0 : i64, opfuse.kind = "loop"
// REMARK: remark: [opfuse-fuse-elementwise] fused: mul -> tanh: saving 0.50 > delta 0.10, R_fused 20 < R_limit 128
// REMARK: remark: [opfuse-fuse-elementwise] fused: tanh -> add: saving 0.60 > delta 0.10
// DELTA: remark: [opfuse-fuse-elementwise] not fused: mul -> tanh: saving 0.50 <= delta 0.90 (time saving 0.50 with 1 launch saved) (would fuse with delta < 0.5000)
// RLIMIT: remark: [opfuse-fuse-elementwise] not fused: mul -> tanh: R_fused 20 >= R_limit 16 (would fuse with R_limit >= 21)
func.func @chain(%x: tensor<64x128xf32>, %a: tensor<128xf32>) -> tensor<64x128xf32> {
  %e = tensor.empty() : tensor<64x128xf32>
  %0 = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x, %a : tensor<64x128xf32>, tensor<128xf32>) outs(%e : tensor<64x128xf32>) {
  ^bb0(%i: f32, %j: f32, %o: f32):
    %m = arith.mulf %i, %j : f32
    linalg.yield %m : f32
  } -> tensor<64x128xf32> loc("mul")
  %1 = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%0 : tensor<64x128xf32>) outs(%e : tensor<64x128xf32>) {
  ^bb0(%i: f32, %o: f32):
    %t = math.tanh %i : f32
    linalg.yield %t : f32
  } -> tensor<64x128xf32> loc("tanh")
  %2 = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%1, %x : tensor<64x128xf32>, tensor<64x128xf32>) outs(%e : tensor<64x128xf32>) {
  ^bb0(%i: f32, %k: f32, %o: f32):
    %t = arith.addf %i, %k : f32
    linalg.yield %t : f32
  } -> tensor<64x128xf32> loc("add")
  return %2 : tensor<64x128xf32>
}

// -----

// Named elementwise ops fuse too; a producer over a smaller iteration space is left to
// producer-consumer fusion (recomputing it per element is not this pass's call).
// CHECK-LABEL: func.func @spaces
// CHECK: linalg.exp
// CHECK-NOT: opfuse.group
// CHECK: linalg.generic
// CHECK-SAME: opfuse.group = 0
// CHECK: linalg.negf
// CHECK-SAME: opfuse.group = 0
// REMARK: remark: [opfuse-fuse-elementwise] not fused: vexp -> bcast_add: iteration spaces differ: 128 vs 64x128
func.func @spaces(%x: tensor<64x128xf32>, %v: tensor<128xf32>) -> tensor<64x128xf32> {
  %ev = tensor.empty() : tensor<128xf32>
  %0 = linalg.exp ins(%v : tensor<128xf32>) outs(%ev : tensor<128xf32>) -> tensor<128xf32> loc("vexp")
  %e = tensor.empty() : tensor<64x128xf32>
  %1 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]}
      ins(%x, %0 : tensor<64x128xf32>, tensor<128xf32>) outs(%e : tensor<64x128xf32>) {
  ^bb0(%i: f32, %j: f32, %o: f32):
    %s = arith.addf %i, %j : f32
    linalg.yield %s : f32
  } -> tensor<64x128xf32> loc("bcast_add")
  %2 = linalg.negf ins(%1 : tensor<64x128xf32>) outs(%e : tensor<64x128xf32>) -> tensor<64x128xf32> loc("neg")
  return %2 : tensor<64x128xf32>
}

// -----

// %a feeds %b and a reduction that %b also needs: fusing %a into %b would make the
// kernel graph cyclic (a -> sum -> b), so it is refused with the op in between named.
// CHECK-LABEL: func.func @cycle
// CHECK-NOT: opfuse.group
// REMARK: remark: [opfuse-fuse-elementwise] not fused: a -> b: would create a cycle through sum
func.func @cycle(%x: tensor<32x16xf32>) -> tensor<32x16xf32> {
  %e = tensor.empty() : tensor<32x16xf32>
  %a = linalg.exp ins(%x : tensor<32x16xf32>) outs(%e : tensor<32x16xf32>) -> tensor<32x16xf32> loc("a")
  %z = arith.constant 0.0 : f32
  %er = tensor.empty() : tensor<32xf32>
  %f = linalg.fill ins(%z : f32) outs(%er : tensor<32xf32>) -> tensor<32xf32>
  %s = linalg.reduce ins(%a : tensor<32x16xf32>) outs(%f : tensor<32xf32>) dimensions = [1]
    (%in: f32, %acc: f32) {
      %r = arith.addf %in, %acc : f32
      linalg.yield %r : f32
    } loc("sum")
  %b = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]}
      ins(%a, %s : tensor<32x16xf32>, tensor<32xf32>) outs(%e : tensor<32x16xf32>) {
  ^bb0(%i: f32, %j: f32, %o: f32):
    %d = arith.divf %i, %j : f32
    linalg.yield %d : f32
  } -> tensor<32x16xf32> loc("b")
  return %b : tensor<32x16xf32>
}
