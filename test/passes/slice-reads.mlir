// RUN: fuse-opt %s | filecheck %s
// RUN: fuse-opt %s --opfuse-remarks 2>&1 >/dev/null | filecheck %s --check-prefix=REMARK

// A slice reads only the elements it selects, and data movement in front of it only what
// the slice keeps: GPT-NeoX's (and Phi's) partial rotary embedding cuts the rotary part of
// each head out of the packed QKV projection (view, permute, split, slice), then halves of
// it for rotate_half. Duplicating the 512 B slice into its three readers re-reads 512 B
// each, not the 6144 B projection it is cut from, so it is duplicated and the whole RoPE
// is one loop kernel. (Counted as reading the whole projection, the duplication was
// refused, "recompute moves 6144 B >= round trip 2048 B", and it was two kernels.)
// CHECK-LABEL: func.func private @fusion_0_loop
// CHECK-NOT: func.func private @fusion_1
// CHECK-LABEL: func.func @partial_rotary
// CHECK-NEXT: call @fusion_0_loop(%arg0, %arg1, %arg2)
// CHECK-NEXT: return
// REMARK-DAG: remark: [opfuse-fuse-producer-consumer] fused: rot -> x1: recompute moves 1536 B < round trip 2048 B
// REMARK-DAG: remark: [opfuse-fuse-producer-consumer] fused: rot -> rope: recompute moves 1536 B < round trip 2048 B
#id4 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
#rope = affine_map<(d0, d1, d2, d3) -> (d2, d3)>
func.func @partial_rotary(%qkv: tensor<2x8x96xf32>, %cos: tensor<8x2xf32>, %sin: tensor<8x2xf32>) -> tensor<2x4x8x2xf32> {
  %heads = tensor.expand_shape %qkv [[0], [1], [2, 3]] output_shape [2, 8, 4, 24] : tensor<2x8x96xf32> into tensor<2x8x4x24xf32> loc("view")
  %et = tensor.empty() : tensor<2x4x8x24xf32>
  %t = linalg.transpose ins(%heads : tensor<2x8x4x24xf32>) outs(%et : tensor<2x4x8x24xf32>) permutation = [0, 2, 1, 3] loc("permute")
  %q = tensor.extract_slice %t[0, 0, 0, 0] [2, 4, 8, 8] [1, 1, 1, 1] : tensor<2x4x8x24xf32> to tensor<2x4x8x8xf32> loc("split.0")
  %rot = tensor.extract_slice %q[0, 0, 0, 0] [2, 4, 8, 2] [1, 1, 1, 1] : tensor<2x4x8x8xf32> to tensor<2x4x8x2xf32> loc("rot")
  %x1 = tensor.extract_slice %rot[0, 0, 0, 0] [2, 4, 8, 1] [1, 1, 1, 1] : tensor<2x4x8x2xf32> to tensor<2x4x8x1xf32> loc("x1")
  %x2 = tensor.extract_slice %rot[0, 0, 0, 1] [2, 4, 8, 1] [1, 1, 1, 1] : tensor<2x4x8x2xf32> to tensor<2x4x8x1xf32> loc("x2")
  %e1 = tensor.empty() : tensor<2x4x8x1xf32>
  %neg = linalg.negf ins(%x2 : tensor<2x4x8x1xf32>) outs(%e1 : tensor<2x4x8x1xf32>) -> tensor<2x4x8x1xf32> loc("neg")
  %half = tensor.concat dim(3) %neg, %x1 : (tensor<2x4x8x1xf32>, tensor<2x4x8x1xf32>) -> tensor<2x4x8x2xf32> loc("rotate_half")
  %e2 = tensor.empty() : tensor<2x4x8x2xf32>
  %emb = linalg.generic {indexing_maps = [#id4, #id4, #rope, #rope, #id4], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%rot, %half, %cos, %sin : tensor<2x4x8x2xf32>, tensor<2x4x8x2xf32>, tensor<8x2xf32>, tensor<8x2xf32>) outs(%e2 : tensor<2x4x8x2xf32>) {
  ^bb0(%r: f32, %h: f32, %c: f32, %s: f32, %o: f32):
    %a = arith.mulf %r, %c : f32
    %b = arith.mulf %h, %s : f32
    %y = arith.addf %a, %b : f32
    linalg.yield %y : f32
  } -> tensor<2x4x8x2xf32> loc("rope")
  return %emb : tensor<2x4x8x2xf32>
}
