// RUN: fuse-opt %s --split-input-file | filecheck %s
// RUN: fuse-opt %s --split-input-file --opfuse-remarks 2>&1 >/dev/null | filecheck %s --check-prefix=REMARK
// RUN: fuse-opt %s --split-input-file --opfuse-fuse-horizontal="r-limit=40" --opfuse-remarks 2>&1 >/dev/null | filecheck %s --check-prefix=GUARD

// Q, K and V projections of one x, each with its bias: one kernel over the three N ranges
// (the weights stay three arguments), three results.
// CHECK-LABEL: func.func private @fusion_0_horizontal
// CHECK-SAME: opfuse.kind = "horizontal"
// CHECK-COUNT-3: linalg.matmul
// CHECK-LABEL: func.func @qkv
// CHECK: %[[R:.*]]:3 = call @fusion_0_horizontal(%arg0, %arg1, %arg2, %arg3, %arg4, %arg5, %arg6)
// CHECK-NOT: call
// CHECK: return %[[R]]#0, %[[R]]#1, %[[R]]#2
// REMARK: v: remark: [opfuse-fuse-horizontal] fused: q -> v: {{.*}}(3 siblings, one LHS read)
// GUARD: v: remark: [opfuse-fuse-horizontal] not fused: q -> v: R_fused {{[0-9]+}} >= R_limit 40
#bias = affine_map<(d0, d1) -> (d1)>
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @qkv(%x: tensor<64x32xf32>, %wq: tensor<32x32xf32>, %wk: tensor<32x32xf32>, %wv: tensor<32x16xf32>,
               %bq: tensor<32xf32>, %bk: tensor<32xf32>, %bv: tensor<16xf32>)
    -> (tensor<64x32xf32>, tensor<64x32xf32>, tensor<64x16xf32>) {
  %zero = arith.constant 0.0 : f32
  %e32 = tensor.empty() : tensor<64x32xf32>
  %e16 = tensor.empty() : tensor<64x16xf32>
  %c32 = linalg.fill ins(%zero : f32) outs(%e32 : tensor<64x32xf32>) -> tensor<64x32xf32>
  %c16 = linalg.fill ins(%zero : f32) outs(%e16 : tensor<64x16xf32>) -> tensor<64x16xf32>
  %q = linalg.matmul ins(%x, %wq : tensor<64x32xf32>, tensor<32x32xf32>) outs(%c32 : tensor<64x32xf32>) -> tensor<64x32xf32> loc("q")
  %k = linalg.matmul ins(%x, %wk : tensor<64x32xf32>, tensor<32x32xf32>) outs(%c32 : tensor<64x32xf32>) -> tensor<64x32xf32> loc("k")
  %v = linalg.matmul ins(%x, %wv : tensor<64x32xf32>, tensor<32x16xf32>) outs(%c16 : tensor<64x16xf32>) -> tensor<64x16xf32> loc("v")
  %qb = linalg.generic {indexing_maps = [#id, #bias, #id], iterator_types = ["parallel", "parallel"]}
      ins(%q, %bq : tensor<64x32xf32>, tensor<32xf32>) outs(%e32 : tensor<64x32xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %s = arith.addf %a, %b : f32
    linalg.yield %s : f32
  } -> tensor<64x32xf32> loc("q.bias")
  %kb = linalg.generic {indexing_maps = [#id, #bias, #id], iterator_types = ["parallel", "parallel"]}
      ins(%k, %bk : tensor<64x32xf32>, tensor<32xf32>) outs(%e32 : tensor<64x32xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %s = arith.addf %a, %b : f32
    linalg.yield %s : f32
  } -> tensor<64x32xf32> loc("k.bias")
  %vb = linalg.generic {indexing_maps = [#id, #bias, #id], iterator_types = ["parallel", "parallel"]}
      ins(%v, %bv : tensor<64x16xf32>, tensor<16xf32>) outs(%e16 : tensor<64x16xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %s = arith.addf %a, %b : f32
    linalg.yield %s : f32
  } -> tensor<64x16xf32> loc("v.bias")
  return %qb, %kb, %vb : tensor<64x32xf32>, tensor<64x32xf32>, tensor<64x16xf32>
}

// -----

// SwiGLU: silu(x @ W1) * (x @ W3) is one kernel (the product reads both siblings at one
// point), the down projection another.
// CHECK-LABEL: func.func private @fusion_0_horizontal
// CHECK-COUNT-2: linalg.matmul
// CHECK: arith.negf
// CHECK: return
// CHECK-LABEL: func.func private @fusion_1_output
// CHECK-LABEL: func.func @swiglu
// CHECK: call @fusion_0_horizontal
// CHECK-NEXT: call @fusion_1_output
// CHECK-NEXT: return
// REMARK: up: remark: [opfuse-fuse-horizontal] fused: gate -> up: {{.*}}(2 siblings, one LHS read, the siblings' product in one tile)
#id2 = affine_map<(d0, d1) -> (d0, d1)>
func.func @swiglu(%x: tensor<64x32xf32>, %w1: tensor<32x64xf32>, %w3: tensor<32x64xf32>, %w2: tensor<64x32xf32>) -> tensor<64x32xf32> {
  %zero = arith.constant 0.0 : f32
  %one = arith.constant 1.0 : f32
  %e = tensor.empty() : tensor<64x64xf32>
  %eo = tensor.empty() : tensor<64x32xf32>
  %c = linalg.fill ins(%zero : f32) outs(%e : tensor<64x64xf32>) -> tensor<64x64xf32>
  %co = linalg.fill ins(%zero : f32) outs(%eo : tensor<64x32xf32>) -> tensor<64x32xf32>
  %g = linalg.matmul ins(%x, %w1 : tensor<64x32xf32>, tensor<32x64xf32>) outs(%c : tensor<64x64xf32>) -> tensor<64x64xf32> loc("gate")
  %u = linalg.matmul ins(%x, %w3 : tensor<64x32xf32>, tensor<32x64xf32>) outs(%c : tensor<64x64xf32>) -> tensor<64x64xf32> loc("up")
  %h = linalg.generic {indexing_maps = [#id2, #id2, #id2], iterator_types = ["parallel", "parallel"]}
      ins(%g, %u : tensor<64x64xf32>, tensor<64x64xf32>) outs(%e : tensor<64x64xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %n = arith.negf %a : f32
    %ex = math.exp %n : f32
    %d = arith.addf %ex, %one : f32
    %s = arith.divf %a, %d : f32
    %p = arith.mulf %s, %b : f32
    linalg.yield %p : f32
  } -> tensor<64x64xf32> loc("swiglu")
  %y = linalg.matmul ins(%h, %w2 : tensor<64x64xf32>, tensor<64x32xf32>) outs(%co : tensor<64x32xf32>) -> tensor<64x32xf32> loc("down")
  return %y : tensor<64x32xf32>
}

// -----

// Refused: the second matmul's weight is computed from the first's result (a path
// between them), so they cannot run side by side.
// CHECK-LABEL: func.func @dependent
// CHECK-COUNT-2: call @fusion_
// REMARK: b: remark: [opfuse-fuse-horizontal] not fused: a -> b: b depends on a
func.func @dependent(%x: tensor<64x32xf32>, %w: tensor<32x32xf32>) -> tensor<64x32xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<64x32xf32>
  %c = linalg.fill ins(%zero : f32) outs(%e : tensor<64x32xf32>) -> tensor<64x32xf32>
  %e2 = tensor.empty() : tensor<32x32xf32>
  %c2 = linalg.fill ins(%zero : f32) outs(%e2 : tensor<32x32xf32>) -> tensor<32x32xf32>
  %a = linalg.matmul ins(%x, %w : tensor<64x32xf32>, tensor<32x32xf32>) outs(%c : tensor<64x32xf32>) -> tensor<64x32xf32> loc("a")
  %wt = tensor.extract_slice %a[0, 0] [32, 32] [1, 1] : tensor<64x32xf32> to tensor<32x32xf32> loc("a.rows")
  %b = linalg.matmul ins(%x, %wt : tensor<64x32xf32>, tensor<32x32xf32>) outs(%c : tensor<64x32xf32>) -> tensor<64x32xf32> loc("b")
  return %b : tensor<64x32xf32>
}
