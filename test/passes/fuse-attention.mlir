// RUN: fuse-opt %s --split-input-file | filecheck %s
// RUN: fuse-opt %s --split-input-file --opfuse-remarks 2>&1 >/dev/null | filecheck %s --check-prefix=REMARK
// RUN: fuse-opt %s --split-input-file --opfuse-fuse-attention --opfuse-remarks 2>&1 >/dev/null | filecheck %s --check-prefix=ALONE
// RUN: fuse-opt %s --split-input-file --opfuse-fuse-attention="r-limit=64" --opfuse-remarks 2>&1 >/dev/null | filecheck %s --check-prefix=GUARD

#id3 = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#row3 = affine_map<(d0, d1, d2) -> (d0, d1)>

// The builder's form: Kᵀ by an explicit transpose, batch_matmul, a scale, the softmax as
// max / exp(x - max) / sum / div, batch_matmul with V: one attention kernel (the transpose
// joins it as Q·Kᵀ's prologue).
// Its bytes are Q, K and V read once and O written once.
// CHECK-LABEL: func.func private @fusion_0_attention
// CHECK-SAME: opfuse.bytes_read = 6144 : i64, opfuse.bytes_written = 2048 : i64{{.*}}opfuse.kind = "attention"
// CHECK-LABEL: func.func @sdpa
// CHECK: call @fusion_0_attention
// CHECK-NOT: call @fusion_1
// REMARK: remark: [opfuse-fuse-attention] fused: qk -> pv: saving {{.*}} > delta 0.10, R_fused {{.*}} < R_limit 128 (Q_S 4096 B stays on chip)
// The pass alone (every op still its own group) forms the same kernel but for the
// transpose, which no earlier pass has put into Q·Kᵀ's group.
// ALONE: remark: [opfuse-fuse-attention] fused: qk -> pv
// The guard decides, like every merge: the kernel's tile needs more than 64 registers.
// GUARD: remark: [opfuse-fuse-attention] not fused: qk -> pv: R_fused {{.*}} >= R_limit 64
func.func @sdpa(%q: tensor<4x8x16xf32>, %k: tensor<4x8x16xf32>, %v: tensor<4x8x16xf32>) -> tensor<4x8x16xf32> {
  %zero = arith.constant 0.0 : f32
  %ninf = arith.constant 0xFF800000 : f32
  %et = tensor.empty() : tensor<4x16x8xf32>
  %kt = linalg.transpose ins(%k : tensor<4x8x16xf32>) outs(%et : tensor<4x16x8xf32>) permutation = [0, 2, 1] loc("kt")
  %es = tensor.empty() : tensor<4x8x8xf32>
  %fs = linalg.fill ins(%zero : f32) outs(%es : tensor<4x8x8xf32>) -> tensor<4x8x8xf32>
  %s = linalg.batch_matmul ins(%q, %kt : tensor<4x8x16xf32>, tensor<4x16x8xf32>) outs(%fs : tensor<4x8x8xf32>) -> tensor<4x8x8xf32> loc("qk")
  %x = linalg.generic {indexing_maps = [#id3, #id3], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%s : tensor<4x8x8xf32>) outs(%es : tensor<4x8x8xf32>) {
  ^bb0(%a: f32, %o: f32):
    %c = arith.constant 0.25 : f32
    %r = arith.mulf %a, %c : f32
    linalg.yield %r : f32
  } -> tensor<4x8x8xf32> loc("scale")
  %er = tensor.empty() : tensor<4x8xf32>
  %fm = linalg.fill ins(%ninf : f32) outs(%er : tensor<4x8xf32>) -> tensor<4x8xf32>
  %m = linalg.generic {indexing_maps = [#id3, #row3], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%x : tensor<4x8x8xf32>) outs(%fm : tensor<4x8xf32>) {
  ^bb0(%a: f32, %o: f32):
    %r = arith.maximumf %a, %o : f32
    linalg.yield %r : f32
  } -> tensor<4x8xf32> loc("max")
  %e = linalg.generic {indexing_maps = [#id3, #row3, #id3], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%x, %m : tensor<4x8x8xf32>, tensor<4x8xf32>) outs(%es : tensor<4x8x8xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %d = arith.subf %a, %b : f32
    %r = math.exp %d : f32
    linalg.yield %r : f32
  } -> tensor<4x8x8xf32> loc("exp")
  %fz = linalg.fill ins(%zero : f32) outs(%er : tensor<4x8xf32>) -> tensor<4x8xf32>
  %l = linalg.generic {indexing_maps = [#id3, #row3], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%e : tensor<4x8x8xf32>) outs(%fz : tensor<4x8xf32>) {
  ^bb0(%a: f32, %o: f32):
    %r = arith.addf %a, %o : f32
    linalg.yield %r : f32
  } -> tensor<4x8xf32> loc("sum")
  %p = linalg.generic {indexing_maps = [#id3, #row3, #id3], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%e, %l : tensor<4x8x8xf32>, tensor<4x8xf32>) outs(%es : tensor<4x8x8xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %r = arith.divf %a, %b : f32
    linalg.yield %r : f32
  } -> tensor<4x8x8xf32> loc("div")
  %eo = tensor.empty() : tensor<4x8x16xf32>
  %fo = linalg.fill ins(%zero : f32) outs(%eo : tensor<4x8x16xf32>) -> tensor<4x8x16xf32>
  %o = linalg.batch_matmul ins(%p, %v : tensor<4x8x8xf32>, tensor<4x8x16xf32>) outs(%fo : tensor<4x8x16xf32>) -> tensor<4x8x16xf32> loc("pv")
  return %o : tensor<4x8x16xf32>
}

// -----

#q = affine_map<(b, h, m, n, k) -> (b, h, m, k)>
#k = affine_map<(b, h, m, n, k) -> (b, h, n, k)>
#s = affine_map<(b, h, m, n, k) -> (b, h, m, n)>
#id4 = affine_map<(b, h, m, n) -> (b, h, m, n)>
#mask = affine_map<(b, h, m, n) -> (b, 0, m, n)>
#keep = affine_map<(b, h, m, n) -> (b, h, m, 0)>
#p = affine_map<(b, h, m, d, n) -> (b, h, m, n)>
#v = affine_map<(b, h, m, d, n) -> (b, h, n, d)>
#o = affine_map<(b, h, m, d, n) -> (b, h, m, d)>

// torch-mlir's form: 4-D generic contractions with Kᵀ in the indexing map (no
// transpose), an additive float mask broadcast over heads, keepdim reductions (a unit dim
// in the output map) and the normalization as a multiplication by the reciprocal.
// CHECK-LABEL: func.func private @fusion_0_attention
// CHECK-LABEL: func.func @torch_mlir_style
// CHECK: call @fusion_0_attention
// CHECK-NOT: call @fusion_1
// REMARK: remark: [opfuse-fuse-attention] fused: qk -> pv
func.func @torch_mlir_style(%q: tensor<2x2x8x4xf32>, %k: tensor<2x2x8x4xf32>, %v: tensor<2x2x8x4xf32>, %add: tensor<2x1x8x8xf32>) -> tensor<2x2x8x4xf32> {
  %zero = arith.constant 0.0 : f32
  %ninf = arith.constant 0xFF800000 : f32
  %es = tensor.empty() : tensor<2x2x8x8xf32>
  %fs = linalg.fill ins(%zero : f32) outs(%es : tensor<2x2x8x8xf32>) -> tensor<2x2x8x8xf32>
  %s = linalg.generic {indexing_maps = [#q, #k, #s], iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]}
      ins(%q, %k : tensor<2x2x8x4xf32>, tensor<2x2x8x4xf32>) outs(%fs : tensor<2x2x8x8xf32>) {
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %t = arith.mulf %a, %b : f32
    %r = arith.addf %acc, %t : f32
    linalg.yield %r : f32
  } -> tensor<2x2x8x8xf32> loc("qk")
  %x = linalg.generic {indexing_maps = [#id4, #mask, #id4], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%s, %add : tensor<2x2x8x8xf32>, tensor<2x1x8x8xf32>) outs(%es : tensor<2x2x8x8xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %c = arith.constant 0.5 : f32
    %t = arith.mulf %a, %c : f32
    %r = arith.addf %t, %b : f32
    linalg.yield %r : f32
  } -> tensor<2x2x8x8xf32> loc("scale_mask")
  %er = tensor.empty() : tensor<2x2x8x1xf32>
  %fm = linalg.fill ins(%ninf : f32) outs(%er : tensor<2x2x8x1xf32>) -> tensor<2x2x8x1xf32>
  %m = linalg.generic {indexing_maps = [#id4, #keep], iterator_types = ["parallel", "parallel", "parallel", "reduction"]}
      ins(%x : tensor<2x2x8x8xf32>) outs(%fm : tensor<2x2x8x1xf32>) {
  ^bb0(%a: f32, %o: f32):
    %r = arith.maxnumf %a, %o : f32
    linalg.yield %r : f32
  } -> tensor<2x2x8x1xf32> loc("amax")
  %e = linalg.generic {indexing_maps = [#id4, #keep, #id4], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%x, %m : tensor<2x2x8x8xf32>, tensor<2x2x8x1xf32>) outs(%es : tensor<2x2x8x8xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %d = arith.subf %a, %b : f32
    %r = math.exp %d : f32
    linalg.yield %r : f32
  } -> tensor<2x2x8x8xf32> loc("exp")
  %fz = linalg.fill ins(%zero : f32) outs(%er : tensor<2x2x8x1xf32>) -> tensor<2x2x8x1xf32>
  %l = linalg.generic {indexing_maps = [#id4, #keep], iterator_types = ["parallel", "parallel", "parallel", "reduction"]}
      ins(%e : tensor<2x2x8x8xf32>) outs(%fz : tensor<2x2x8x1xf32>) {
  ^bb0(%a: f32, %o: f32):
    %r = arith.addf %a, %o : f32
    linalg.yield %r : f32
  } -> tensor<2x2x8x1xf32> loc("sum")
  %p = linalg.generic {indexing_maps = [#id4, #keep, #id4], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%e, %l : tensor<2x2x8x8xf32>, tensor<2x2x8x1xf32>) outs(%es : tensor<2x2x8x8xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %one = arith.constant 1.0 : f32
    %inv = arith.divf %one, %b : f32
    %r = arith.mulf %a, %inv : f32
    linalg.yield %r : f32
  } -> tensor<2x2x8x8xf32> loc("normalize")
  %eo = tensor.empty() : tensor<2x2x8x4xf32>
  %fo = linalg.fill ins(%zero : f32) outs(%eo : tensor<2x2x8x4xf32>) -> tensor<2x2x8x4xf32>
  %o = linalg.generic {indexing_maps = [#p, #v, #o], iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]}
      ins(%p, %v : tensor<2x2x8x8xf32>, tensor<2x2x8x4xf32>) outs(%fo : tensor<2x2x8x4xf32>) {
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %t = arith.mulf %a, %b : f32
    %r = arith.addf %acc, %t : f32
    linalg.yield %r : f32
  } -> tensor<2x2x8x4xf32> loc("pv")
  return %o : tensor<2x2x8x4xf32>
}

// -----

#bcast = affine_map<(b, h, n, d) -> (b, 0, n, d)>
#id4 = affine_map<(b, h, n, d) -> (b, h, n, d)>
#q = affine_map<(b, h, m, n, k) -> (b, h, m, k)>
#k = affine_map<(b, h, m, n, k) -> (b, h, n, k)>
#s = affine_map<(b, h, m, n, k) -> (b, h, m, n)>
#sid = affine_map<(b, h, m, n) -> (b, h, m, n)>
#row = affine_map<(b, h, m, n) -> (b, h, m)>
#p = affine_map<(b, h, m, d, n) -> (b, h, m, n)>
#v = affine_map<(b, h, m, d, n) -> (b, h, n, d)>
#o = affine_map<(b, h, m, d, n) -> (b, h, m, d)>

// Hand-written, grouped-query: one K/V head broadcast to both query heads, a causal mask
// from the loop indices inside the scale's payload (iota + compare + select), and
// exp(x - max) fused into the sum's payload. The ledger records the causal offset the
// kernel uses to skip key tiles above the diagonal.
// CHECK-LABEL: func.func private @fusion_0_attention
// CHECK-LABEL: func.func @gqa_causal
// CHECK: call @fusion_0_attention
// CHECK-NOT: call @fusion_1
// REMARK: remark: [opfuse-fuse-attention] fused: qk -> pv
// REMARK-SAME: (Q_S {{[0-9]+}} B stays on chip, causal: keys > query + 0 skipped)
func.func @gqa_causal(%q: tensor<1x2x8x4xf32>, %k1: tensor<1x1x8x4xf32>, %v1: tensor<1x1x8x4xf32>) -> tensor<1x2x8x4xf32> {
  %zero = arith.constant 0.0 : f32
  %ninf = arith.constant 0xFF800000 : f32
  %ekv = tensor.empty() : tensor<1x2x8x4xf32>
  %k = linalg.generic {indexing_maps = [#bcast, #id4], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%k1 : tensor<1x1x8x4xf32>) outs(%ekv : tensor<1x2x8x4xf32>) {
  ^bb0(%a: f32, %o: f32):
    linalg.yield %a : f32
  } -> tensor<1x2x8x4xf32> loc("repeat_k")
  %v = linalg.generic {indexing_maps = [#bcast, #id4], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%v1 : tensor<1x1x8x4xf32>) outs(%ekv : tensor<1x2x8x4xf32>) {
  ^bb0(%a: f32, %o: f32):
    linalg.yield %a : f32
  } -> tensor<1x2x8x4xf32> loc("repeat_v")
  %es = tensor.empty() : tensor<1x2x8x8xf32>
  %fs = linalg.fill ins(%zero : f32) outs(%es : tensor<1x2x8x8xf32>) -> tensor<1x2x8x8xf32>
  %s = linalg.generic {indexing_maps = [#q, #k, #s], iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]}
      ins(%q, %k : tensor<1x2x8x4xf32>, tensor<1x2x8x4xf32>) outs(%fs : tensor<1x2x8x8xf32>) {
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %t = arith.mulf %a, %b : f32
    %r = arith.addf %acc, %t : f32
    linalg.yield %r : f32
  } -> tensor<1x2x8x8xf32> loc("qk")
  %x = linalg.generic {indexing_maps = [#sid, #sid], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%s : tensor<1x2x8x8xf32>) outs(%es : tensor<1x2x8x8xf32>) {
  ^bb0(%a: f32, %o: f32):
    %c = arith.constant 0.5 : f32
    %t = arith.mulf %a, %c : f32
    %i = linalg.index 2 : index
    %j = linalg.index 3 : index
    %keep = arith.cmpi uge, %i, %j : index
    %r = arith.select %keep, %t, %ninf : f32
    linalg.yield %r : f32
  } -> tensor<1x2x8x8xf32> loc("scale_causal")
  %er = tensor.empty() : tensor<1x2x8xf32>
  %fm = linalg.fill ins(%ninf : f32) outs(%er : tensor<1x2x8xf32>) -> tensor<1x2x8xf32>
  %m = linalg.generic {indexing_maps = [#sid, #row], iterator_types = ["parallel", "parallel", "parallel", "reduction"]}
      ins(%x : tensor<1x2x8x8xf32>) outs(%fm : tensor<1x2x8xf32>) {
  ^bb0(%a: f32, %o: f32):
    %r = arith.maximumf %a, %o : f32
    linalg.yield %r : f32
  } -> tensor<1x2x8xf32> loc("max")
  %fz = linalg.fill ins(%zero : f32) outs(%er : tensor<1x2x8xf32>) -> tensor<1x2x8xf32>
  %l = linalg.generic {indexing_maps = [#sid, #row, #row], iterator_types = ["parallel", "parallel", "parallel", "reduction"]}
      ins(%x, %m : tensor<1x2x8x8xf32>, tensor<1x2x8xf32>) outs(%fz : tensor<1x2x8xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %d = arith.subf %a, %b : f32
    %t = math.exp %d : f32
    %r = arith.addf %t, %o : f32
    linalg.yield %r : f32
  } -> tensor<1x2x8xf32> loc("sum_exp")
  %p = linalg.generic {indexing_maps = [#sid, #row, #row, #sid], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%x, %m, %l : tensor<1x2x8x8xf32>, tensor<1x2x8xf32>, tensor<1x2x8xf32>) outs(%es : tensor<1x2x8x8xf32>) {
  ^bb0(%a: f32, %b: f32, %c: f32, %o: f32):
    %d = arith.subf %a, %b : f32
    %t = math.exp %d : f32
    %r = arith.divf %t, %c : f32
    linalg.yield %r : f32
  } -> tensor<1x2x8x8xf32> loc("probs")
  %fo = linalg.fill ins(%zero : f32) outs(%ekv : tensor<1x2x8x4xf32>) -> tensor<1x2x8x4xf32>
  %o = linalg.generic {indexing_maps = [#p, #v, #o], iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]}
      ins(%p, %v : tensor<1x2x8x8xf32>, tensor<1x2x8x4xf32>) outs(%fo : tensor<1x2x8x4xf32>) {
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %t = arith.mulf %a, %b : f32
    %r = arith.addf %acc, %t : f32
    linalg.yield %r : f32
  } -> tensor<1x2x8x4xf32> loc("pv")
  return %o : tensor<1x2x8x4xf32>
}

// -----

#id3 = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#row3 = affine_map<(d0, d1, d2) -> (d0, d1)>

// Refused: the scores are also returned, so S would have to be written; the three
// kernels stay apart and the ledger says why.
// CHECK-NOT: _attention
// CHECK-LABEL: func.func @scores_returned
// CHECK: return
// REMARK: remark: [opfuse-fuse-attention] not fused: qk -> pv: scale is also returned: the attention kernel keeps S and P on chip and writes only its result
func.func @scores_returned(%q: tensor<4x8x16xf32>, %kt: tensor<4x16x8xf32>, %v: tensor<4x8x16xf32>) -> (tensor<4x8x16xf32>, tensor<4x8x8xf32>) {
  %zero = arith.constant 0.0 : f32
  %ninf = arith.constant 0xFF800000 : f32
  %es = tensor.empty() : tensor<4x8x8xf32>
  %fs = linalg.fill ins(%zero : f32) outs(%es : tensor<4x8x8xf32>) -> tensor<4x8x8xf32>
  %s = linalg.batch_matmul ins(%q, %kt : tensor<4x8x16xf32>, tensor<4x16x8xf32>) outs(%fs : tensor<4x8x8xf32>) -> tensor<4x8x8xf32> loc("qk")
  %x = linalg.generic {indexing_maps = [#id3, #id3], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%s : tensor<4x8x8xf32>) outs(%es : tensor<4x8x8xf32>) {
  ^bb0(%a: f32, %o: f32):
    %c = arith.constant 0.25 : f32
    %r = arith.mulf %a, %c : f32
    linalg.yield %r : f32
  } -> tensor<4x8x8xf32> loc("scale")
  %er = tensor.empty() : tensor<4x8xf32>
  %fm = linalg.fill ins(%ninf : f32) outs(%er : tensor<4x8xf32>) -> tensor<4x8xf32>
  %m = linalg.generic {indexing_maps = [#id3, #row3], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%x : tensor<4x8x8xf32>) outs(%fm : tensor<4x8xf32>) {
  ^bb0(%a: f32, %o: f32):
    %r = arith.maximumf %a, %o : f32
    linalg.yield %r : f32
  } -> tensor<4x8xf32> loc("max")
  %e = linalg.generic {indexing_maps = [#id3, #row3, #id3], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%x, %m : tensor<4x8x8xf32>, tensor<4x8xf32>) outs(%es : tensor<4x8x8xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %d = arith.subf %a, %b : f32
    %r = math.exp %d : f32
    linalg.yield %r : f32
  } -> tensor<4x8x8xf32> loc("exp")
  %fz = linalg.fill ins(%zero : f32) outs(%er : tensor<4x8xf32>) -> tensor<4x8xf32>
  %l = linalg.generic {indexing_maps = [#id3, #row3], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%e : tensor<4x8x8xf32>) outs(%fz : tensor<4x8xf32>) {
  ^bb0(%a: f32, %o: f32):
    %r = arith.addf %a, %o : f32
    linalg.yield %r : f32
  } -> tensor<4x8xf32> loc("sum")
  %p = linalg.generic {indexing_maps = [#id3, #row3, #id3], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%e, %l : tensor<4x8x8xf32>, tensor<4x8xf32>) outs(%es : tensor<4x8x8xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %r = arith.divf %a, %b : f32
    linalg.yield %r : f32
  } -> tensor<4x8x8xf32> loc("div")
  %eo = tensor.empty() : tensor<4x8x16xf32>
  %fo = linalg.fill ins(%zero : f32) outs(%eo : tensor<4x8x16xf32>) -> tensor<4x8x16xf32>
  %o = linalg.batch_matmul ins(%p, %v : tensor<4x8x8xf32>, tensor<4x8x16xf32>) outs(%fo : tensor<4x8x16xf32>) -> tensor<4x8x16xf32> loc("pv")
  return %o, %x : tensor<4x8x16xf32>, tensor<4x8x8xf32>
}

// -----

#id3 = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#col3 = affine_map<(d0, d1, d2) -> (d0, d2)>

// Not attention: the softmax runs over the queries (axis -2), but P @ V sums over the
// keys. Refused with the reason; nothing is merged.
// CHECK-NOT: _attention
// CHECK-LABEL: func.func @softmax_over_queries
// CHECK: return
// REMARK: remark: [opfuse-fuse-attention] not fused: pv -> pv: the softmax's reductions do not reduce the scores P is made of
func.func @softmax_over_queries(%s: tensor<4x8x8xf32>, %v: tensor<4x8x16xf32>) -> tensor<4x8x16xf32> {
  %zero = arith.constant 0.0 : f32
  %ninf = arith.constant 0xFF800000 : f32
  %es = tensor.empty() : tensor<4x8x8xf32>
  %er = tensor.empty() : tensor<4x8xf32>
  %fm = linalg.fill ins(%ninf : f32) outs(%er : tensor<4x8xf32>) -> tensor<4x8xf32>
  %m = linalg.generic {indexing_maps = [#id3, #col3], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%s : tensor<4x8x8xf32>) outs(%fm : tensor<4x8xf32>) {
  ^bb0(%a: f32, %o: f32):
    %r = arith.maximumf %a, %o : f32
    linalg.yield %r : f32
  } -> tensor<4x8xf32> loc("max")
  %e = linalg.generic {indexing_maps = [#id3, #col3, #id3], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%s, %m : tensor<4x8x8xf32>, tensor<4x8xf32>) outs(%es : tensor<4x8x8xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %d = arith.subf %a, %b : f32
    %r = math.exp %d : f32
    linalg.yield %r : f32
  } -> tensor<4x8x8xf32> loc("exp")
  %fz = linalg.fill ins(%zero : f32) outs(%er : tensor<4x8xf32>) -> tensor<4x8xf32>
  %l = linalg.generic {indexing_maps = [#id3, #col3], iterator_types = ["parallel", "reduction", "parallel"]}
      ins(%e : tensor<4x8x8xf32>) outs(%fz : tensor<4x8xf32>) {
  ^bb0(%a: f32, %o: f32):
    %r = arith.addf %a, %o : f32
    linalg.yield %r : f32
  } -> tensor<4x8xf32> loc("sum")
  %p = linalg.generic {indexing_maps = [#id3, #col3, #id3], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%e, %l : tensor<4x8x8xf32>, tensor<4x8xf32>) outs(%es : tensor<4x8x8xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %r = arith.divf %a, %b : f32
    linalg.yield %r : f32
  } -> tensor<4x8x8xf32> loc("div")
  %eo = tensor.empty() : tensor<4x8x16xf32>
  %fo = linalg.fill ins(%zero : f32) outs(%eo : tensor<4x8x16xf32>) -> tensor<4x8x16xf32>
  %o = linalg.batch_matmul ins(%p, %v : tensor<4x8x8xf32>, tensor<4x8x16xf32>) outs(%fo : tensor<4x8x16xf32>) -> tensor<4x8x16xf32> loc("pv")
  return %o : tensor<4x8x16xf32>
}
