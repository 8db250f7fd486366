// RUN: fuse-opt %s --split-input-file | filecheck %s
// RUN: fuse-opt %s --split-input-file --opfuse-remarks 2>&1 >/dev/null | filecheck %s --check-prefix=REMARK

// A decoder's attention whose permuted K and V are also returned (Hugging Face's KV cache,
// `present`): the attention kernel reads K and V through its own transposes and writes
// only O; one loop kernel beside it writes the returned K and V (the transposes cloned
// out of the attention group). The guard counts what that copy reads again (K and V,
// 4096 B) against S and P's round trips (Q_S, 16384 B).
// CHECK-LABEL: func.func private @fusion_0_attention(%arg0: tensor<16x4x8xf32>, %arg1: tensor<16x4x8xf32>, %arg2: tensor<16x4x8xf32>) -> tensor<4x16x8xf32>
// CHECK-SAME: opfuse.bytes_read = 6144 : i64, opfuse.bytes_written = 2048 : i64{{.*}}opfuse.kind = "attention"
// CHECK-LABEL: func.func private @fusion_1_loop(%arg0: tensor<16x4x8xf32>, %arg1: tensor<16x4x8xf32>) -> (tensor<4x16x8xf32>, tensor<4x16x8xf32>)
// CHECK-COUNT-2: linalg.transpose
// CHECK-NEXT: return
// CHECK-LABEL: func.func @kv_returned
// CHECK-NEXT: %[[O:.*]] = call @fusion_0_attention(%arg0, %arg1, %arg2)
// CHECK-NEXT: %[[KV:.*]]:2 = call @fusion_1_loop(%arg1, %arg2)
// CHECK-NEXT: return %[[O]], %[[KV]]#0, %[[KV]]#1
// REMARK: remark: [opfuse-fuse-attention] fused: qk -> pv: saving 0.43 > delta 0.10, R_fused {{[0-9]+}} < R_limit 128 (Q_S 16384 B stays on chip; k_heads, v_heads also read outside: copied out by 1 kernel beside it (4096 B read again))

#id3 = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#row3 = affine_map<(d0, d1, d2) -> (d0, d1)>
func.func @kv_returned(%q: tensor<16x4x8xf32>, %k: tensor<16x4x8xf32>, %v: tensor<16x4x8xf32>) -> (tensor<4x16x8xf32>, tensor<4x16x8xf32>, tensor<4x16x8xf32>) {
  %zero = arith.constant 0.0 : f32
  %ninf = arith.constant 0xFF800000 : f32
  %eh = tensor.empty() : tensor<4x16x8xf32>
  %qh = linalg.transpose ins(%q : tensor<16x4x8xf32>) outs(%eh : tensor<4x16x8xf32>) permutation = [1, 0, 2] loc("q_heads")
  %kh = linalg.transpose ins(%k : tensor<16x4x8xf32>) outs(%eh : tensor<4x16x8xf32>) permutation = [1, 0, 2] loc("k_heads")
  %vh = linalg.transpose ins(%v : tensor<16x4x8xf32>) outs(%eh : tensor<4x16x8xf32>) permutation = [1, 0, 2] loc("v_heads")
  %et = tensor.empty() : tensor<4x8x16xf32>
  %kt = linalg.transpose ins(%kh : tensor<4x16x8xf32>) outs(%et : tensor<4x8x16xf32>) permutation = [0, 2, 1] loc("kt")
  %es = tensor.empty() : tensor<4x16x16xf32>
  %fs = linalg.fill ins(%zero : f32) outs(%es : tensor<4x16x16xf32>) -> tensor<4x16x16xf32>
  %s = linalg.batch_matmul ins(%qh, %kt : tensor<4x16x8xf32>, tensor<4x8x16xf32>) outs(%fs : tensor<4x16x16xf32>) -> tensor<4x16x16xf32> loc("qk")
  %x = linalg.generic {indexing_maps = [#id3, #id3], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%s : tensor<4x16x16xf32>) outs(%es : tensor<4x16x16xf32>) {
  ^bb0(%a: f32, %o: f32):
    %c = arith.constant 0.25 : f32
    %r = arith.mulf %a, %c : f32
    linalg.yield %r : f32
  } -> tensor<4x16x16xf32> loc("scale")
  %er = tensor.empty() : tensor<4x16xf32>
  %fm = linalg.fill ins(%ninf : f32) outs(%er : tensor<4x16xf32>) -> tensor<4x16xf32>
  %m = linalg.generic {indexing_maps = [#id3, #row3], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%x : tensor<4x16x16xf32>) outs(%fm : tensor<4x16xf32>) {
  ^bb0(%a: f32, %o: f32):
    %r = arith.maximumf %a, %o : f32
    linalg.yield %r : f32
  } -> tensor<4x16xf32> loc("max")
  %e = linalg.generic {indexing_maps = [#id3, #row3, #id3], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%x, %m : tensor<4x16x16xf32>, tensor<4x16xf32>) outs(%es : tensor<4x16x16xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %d = arith.subf %a, %b : f32
    %r = math.exp %d : f32
    linalg.yield %r : f32
  } -> tensor<4x16x16xf32> loc("exp")
  %fz = linalg.fill ins(%zero : f32) outs(%er : tensor<4x16xf32>) -> tensor<4x16xf32>
  %l = linalg.generic {indexing_maps = [#id3, #row3], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%e : tensor<4x16x16xf32>) outs(%fz : tensor<4x16xf32>) {
  ^bb0(%a: f32, %o: f32):
    %r = arith.addf %a, %o : f32
    linalg.yield %r : f32
  } -> tensor<4x16xf32> loc("sum")
  %p = linalg.generic {indexing_maps = [#id3, #row3, #id3], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%e, %l : tensor<4x16x16xf32>, tensor<4x16xf32>) outs(%es : tensor<4x16x16xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %r = arith.divf %a, %b : f32
    linalg.yield %r : f32
  } -> tensor<4x16x16xf32> loc("div")
  %fo = linalg.fill ins(%zero : f32) outs(%eh : tensor<4x16x8xf32>) -> tensor<4x16x8xf32>
  %o = linalg.batch_matmul ins(%p, %vh : tensor<4x16x16xf32>, tensor<4x16x8xf32>) outs(%fo : tensor<4x16x8xf32>) -> tensor<4x16x8xf32> loc("pv")
  return %o, %kh, %vh : tensor<4x16x8xf32>, tensor<4x16x8xf32>, tensor<4x16x8xf32>
}

// -----

// The same with 8 keys and head dim 16: S and P (Q_S 4096 B) are smaller than the K and
// V the copy would read again, so the guard refuses; the three kernels stay (Q·Kᵀ writes
// the returned K, P·V the returned V).
// CHECK-LABEL: func.func @kv_returned_short
// CHECK-NEXT: call @fusion_0_output
// CHECK-NEXT: call @fusion_1_input
// CHECK-NEXT: call @fusion_2_output
// CHECK-NEXT: return
// REMARK: remark: [opfuse-fuse-attention] not fused: qk -> pv: saving 0.00 <= delta 0.10


#id3 = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#row3 = affine_map<(d0, d1, d2) -> (d0, d1)>
func.func @kv_returned_short(%q: tensor<8x4x16xf32>, %k: tensor<8x4x16xf32>, %v: tensor<8x4x16xf32>) -> (tensor<4x8x16xf32>, tensor<4x8x16xf32>, tensor<4x8x16xf32>) {
  %zero = arith.constant 0.0 : f32
  %ninf = arith.constant 0xFF800000 : f32
  %eh = tensor.empty() : tensor<4x8x16xf32>
  %qh = linalg.transpose ins(%q : tensor<8x4x16xf32>) outs(%eh : tensor<4x8x16xf32>) permutation = [1, 0, 2] loc("q_heads")
  %kh = linalg.transpose ins(%k : tensor<8x4x16xf32>) outs(%eh : tensor<4x8x16xf32>) permutation = [1, 0, 2] loc("k_heads")
  %vh = linalg.transpose ins(%v : tensor<8x4x16xf32>) outs(%eh : tensor<4x8x16xf32>) permutation = [1, 0, 2] loc("v_heads")
  %et = tensor.empty() : tensor<4x16x8xf32>
  %kt = linalg.transpose ins(%kh : tensor<4x8x16xf32>) outs(%et : tensor<4x16x8xf32>) permutation = [0, 2, 1] loc("kt")
  %es = tensor.empty() : tensor<4x8x8xf32>
  %fs = linalg.fill ins(%zero : f32) outs(%es : tensor<4x8x8xf32>) -> tensor<4x8x8xf32>
  %s = linalg.batch_matmul ins(%qh, %kt : tensor<4x8x16xf32>, tensor<4x16x8xf32>) outs(%fs : tensor<4x8x8xf32>) -> tensor<4x8x8xf32> loc("qk")
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
  %fo = linalg.fill ins(%zero : f32) outs(%eh : tensor<4x8x16xf32>) -> tensor<4x8x16xf32>
  %o = linalg.batch_matmul ins(%p, %vh : tensor<4x8x8xf32>, tensor<4x8x16xf32>) outs(%fo : tensor<4x8x16xf32>) -> tensor<4x8x16xf32> loc("pv")
  return %o, %kh, %vh : tensor<4x8x16xf32>, tensor<4x8x16xf32>, tensor<4x8x16xf32>
}

