// RUN: fuse-opt %s --split-input-file | filecheck %s
// RUN: fuse-opt %s --split-input-file --opfuse-remarks 2>&1 >/dev/null | filecheck %s --check-prefix=REMARK

// The rotary embedding (RoPE) as a prologue of the attention kernel, in the form the torch
// importer writes transformers' Llama attention: the projections' heads split
// (expand_shape, transpose), q * cos + rotate_half(q) * sin with rotate_half as two
// slices, a negation and a concat, the same on K, then SDPA. Each rotation joins the
// attention group as its own guard candidate: the rotated Q and K never go through
// memory (the kernels evaluate them while they stage Q and each K tile).
// CHECK-LABEL: func.func private @fusion_0_attention
// CHECK-SAME: opfuse.kind = "attention"
// CHECK: tensor.concat dim(3)
// CHECK: tensor.concat dim(3)
// CHECK: linalg.batch_matmul
// CHECK-LABEL: func.func @rope(
// CHECK-NEXT: call @fusion_0_attention
// CHECK-NEXT: return
// REMARK: remark: [opfuse-fuse-attention] fused: scaled_dot_product_attention.qk -> scaled_dot_product_attention: {{.*}}(Q_S 512 B stays on chip)
// REMARK: remark: [opfuse-fuse-attention] fused: add -> scaled_dot_product_attention: saving 0.29 > delta 0.10, R_fused {{[0-9]+}} < R_limit 128 (Q prologue: Q computed where the kernel stages it, never written)
// REMARK: remark: [opfuse-fuse-attention] fused: add_1 -> scaled_dot_product_attention: saving 0.38 > delta 0.10, R_fused {{[0-9]+}} < R_limit 128 (K prologue: K computed where the kernel stages it, never written)
func.func @rope(%qp: tensor<1x4x8xf32> loc("qp"), %kp: tensor<1x4x8xf32> loc("kp"), %v: tensor<1x2x4x4xf32> loc("v"), %cos: tensor<1x4x4xf32> loc("cos"), %sin: tensor<1x4x4xf32> loc("sin")) -> (tensor<1x2x4x4xf32>) {
  %0 = tensor.expand_shape %qp [[0], [1], [2, 3]] output_shape [1, 4, 2, 4] : tensor<1x4x8xf32> into tensor<1x4x2x4xf32> loc("view")
  %1 = tensor.empty() : tensor<1x2x4x4xf32> loc("permute")
  %2 = linalg.transpose ins(%0 : tensor<1x4x2x4xf32>) outs(%1 : tensor<1x2x4x4xf32>) permutation = [0, 2, 1, 3] loc("permute")
  %3 = tensor.expand_shape %kp [[0], [1], [2, 3]] output_shape [1, 4, 2, 4] : tensor<1x4x8xf32> into tensor<1x4x2x4xf32> loc("view_1")
  %4 = tensor.empty() : tensor<1x2x4x4xf32> loc("permute_1")
  %5 = linalg.transpose ins(%3 : tensor<1x4x2x4xf32>) outs(%4 : tensor<1x2x4x4xf32>) permutation = [0, 2, 1, 3] loc("permute_1")
  %6 = tensor.expand_shape %cos [[0], [1, 2], [3]] output_shape [1, 1, 4, 4] : tensor<1x4x4xf32> into tensor<1x1x4x4xf32> loc("unsqueeze")
  %7 = tensor.expand_shape %sin [[0], [1, 2], [3]] output_shape [1, 1, 4, 4] : tensor<1x4x4xf32> into tensor<1x1x4x4xf32> loc("unsqueeze_1")
  %8 = tensor.empty() : tensor<1x2x4x4xf32> loc("mul")
  %9 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, 0, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%2, %6 : tensor<1x2x4x4xf32>, tensor<1x1x4x4xf32>) outs(%8 : tensor<1x2x4x4xf32>) {
  ^bb0(%10: f32, %11: f32, %12: f32):
    %13 = arith.mulf %10, %11 : f32
    linalg.yield %13 : f32
  } -> tensor<1x2x4x4xf32> loc("mul")
  %14 = tensor.extract_slice %2[0, 0, 0, 0][1, 2, 4, 2][1, 1, 1, 1] : tensor<1x2x4x4xf32> to tensor<1x2x4x2xf32> loc("slice_1")
  %15 = tensor.extract_slice %2[0, 0, 0, 2][1, 2, 4, 2][1, 1, 1, 1] : tensor<1x2x4x4xf32> to tensor<1x2x4x2xf32> loc("slice_2")
  %16 = tensor.empty() : tensor<1x2x4x2xf32> loc("neg")
  %17 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%15 : tensor<1x2x4x2xf32>) outs(%16 : tensor<1x2x4x2xf32>) {
  ^bb0(%18: f32, %19: f32):
    %20 = arith.negf %18 : f32
    linalg.yield %20 : f32
  } -> tensor<1x2x4x2xf32> loc("neg")
  %21 = tensor.concat dim(3) %17, %14 : (tensor<1x2x4x2xf32>, tensor<1x2x4x2xf32>) -> tensor<1x2x4x4xf32> loc("cat")
  %22 = tensor.empty() : tensor<1x2x4x4xf32> loc("mul_1")
  %23 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, 0, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%21, %7 : tensor<1x2x4x4xf32>, tensor<1x1x4x4xf32>) outs(%22 : tensor<1x2x4x4xf32>) {
  ^bb0(%24: f32, %25: f32, %26: f32):
    %27 = arith.mulf %24, %25 : f32
    linalg.yield %27 : f32
  } -> tensor<1x2x4x4xf32> loc("mul_1")
  %28 = tensor.empty() : tensor<1x2x4x4xf32> loc("add")
  %29 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%9, %23 : tensor<1x2x4x4xf32>, tensor<1x2x4x4xf32>) outs(%28 : tensor<1x2x4x4xf32>) {
  ^bb0(%30: f32, %31: f32, %32: f32):
    %33 = arith.addf %30, %31 : f32
    linalg.yield %33 : f32
  } -> tensor<1x2x4x4xf32> loc("add")
  %34 = tensor.empty() : tensor<1x2x4x4xf32> loc("mul_2")
  %35 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, 0, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%5, %6 : tensor<1x2x4x4xf32>, tensor<1x1x4x4xf32>) outs(%34 : tensor<1x2x4x4xf32>) {
  ^bb0(%36: f32, %37: f32, %38: f32):
    %39 = arith.mulf %36, %37 : f32
    linalg.yield %39 : f32
  } -> tensor<1x2x4x4xf32> loc("mul_2")
  %40 = tensor.extract_slice %5[0, 0, 0, 0][1, 2, 4, 2][1, 1, 1, 1] : tensor<1x2x4x4xf32> to tensor<1x2x4x2xf32> loc("slice_3")
  %41 = tensor.extract_slice %5[0, 0, 0, 2][1, 2, 4, 2][1, 1, 1, 1] : tensor<1x2x4x4xf32> to tensor<1x2x4x2xf32> loc("slice_4")
  %42 = tensor.empty() : tensor<1x2x4x2xf32> loc("neg_1")
  %43 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%41 : tensor<1x2x4x2xf32>) outs(%42 : tensor<1x2x4x2xf32>) {
  ^bb0(%44: f32, %45: f32):
    %46 = arith.negf %44 : f32
    linalg.yield %46 : f32
  } -> tensor<1x2x4x2xf32> loc("neg_1")
  %47 = tensor.concat dim(3) %43, %40 : (tensor<1x2x4x2xf32>, tensor<1x2x4x2xf32>) -> tensor<1x2x4x4xf32> loc("cat_1")
  %48 = tensor.empty() : tensor<1x2x4x4xf32> loc("mul_3")
  %49 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, 0, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%47, %7 : tensor<1x2x4x4xf32>, tensor<1x1x4x4xf32>) outs(%48 : tensor<1x2x4x4xf32>) {
  ^bb0(%50: f32, %51: f32, %52: f32):
    %53 = arith.mulf %50, %51 : f32
    linalg.yield %53 : f32
  } -> tensor<1x2x4x4xf32> loc("mul_3")
  %54 = tensor.empty() : tensor<1x2x4x4xf32> loc("add_1")
  %55 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%35, %49 : tensor<1x2x4x4xf32>, tensor<1x2x4x4xf32>) outs(%54 : tensor<1x2x4x4xf32>) {
  ^bb0(%56: f32, %57: f32, %58: f32):
    %59 = arith.addf %56, %57 : f32
    linalg.yield %59 : f32
  } -> tensor<1x2x4x4xf32> loc("add_1")
  %60 = tensor.empty() : tensor<1x2x4x4xf32> loc("scaled_dot_product_attention.k_t")
  %61 = linalg.transpose ins(%55 : tensor<1x2x4x4xf32>) outs(%60 : tensor<1x2x4x4xf32>) permutation = [0, 1, 3, 2] loc("scaled_dot_product_attention.k_t")
  %62 = tensor.collapse_shape %29 [[0, 1], [2], [3]] : tensor<1x2x4x4xf32> into tensor<2x4x4xf32> loc("scaled_dot_product_attention.qk.lhs")
  %63 = tensor.collapse_shape %61 [[0, 1], [2], [3]] : tensor<1x2x4x4xf32> into tensor<2x4x4xf32> loc("scaled_dot_product_attention.qk.rhs")
  %64 = tensor.empty() : tensor<2x4x4xf32> loc("scaled_dot_product_attention.qk")
  %65 = arith.constant 0.0 : f32 loc("scaled_dot_product_attention.qk")
  %66 = linalg.fill ins(%65 : f32) outs(%64 : tensor<2x4x4xf32>) -> tensor<2x4x4xf32> loc("scaled_dot_product_attention.qk")
  %67 = linalg.batch_matmul ins(%62, %63 : tensor<2x4x4xf32>, tensor<2x4x4xf32>) outs(%66 : tensor<2x4x4xf32>) -> tensor<2x4x4xf32> loc("scaled_dot_product_attention.qk")
  %68 = tensor.expand_shape %67 [[0, 1], [2], [3]] output_shape [1, 2, 4, 4] : tensor<2x4x4xf32> into tensor<1x2x4x4xf32> loc("scaled_dot_product_attention.qk.out")
  %69 = tensor.empty() : tensor<1x2x4x4xf32> loc("scaled_dot_product_attention.scale")
  %70 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%68 : tensor<1x2x4x4xf32>) outs(%69 : tensor<1x2x4x4xf32>) {
  ^bb0(%71: f32, %72: f32):
    %73 = arith.constant 0.5 : f32
    %74 = arith.mulf %71, %73 : f32
    linalg.yield %74 : f32
  } -> tensor<1x2x4x4xf32> loc("scaled_dot_product_attention.scale")
  %75 = tensor.empty() : tensor<1x2x4xf32> loc("scaled_dot_product_attention.softmax.max")
  %76 = arith.constant 0xFF800000 : f32 loc("scaled_dot_product_attention.softmax.max")
  %77 = linalg.fill ins(%76 : f32) outs(%75 : tensor<1x2x4xf32>) -> tensor<1x2x4xf32> loc("scaled_dot_product_attention.softmax.max")
  %78 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%70 : tensor<1x2x4x4xf32>) outs(%77 : tensor<1x2x4xf32>) {
  ^bb0(%79: f32, %80: f32):
    %81 = arith.maximumf %79, %80 : f32
    linalg.yield %81 : f32
  } -> tensor<1x2x4xf32> loc("scaled_dot_product_attention.softmax.max")
  %82 = tensor.empty() : tensor<1x2x4x4xf32> loc("scaled_dot_product_attention.softmax.sub")
  %83 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%70, %78 : tensor<1x2x4x4xf32>, tensor<1x2x4xf32>) outs(%82 : tensor<1x2x4x4xf32>) {
  ^bb0(%84: f32, %85: f32, %86: f32):
    %87 = arith.subf %84, %85 : f32
    linalg.yield %87 : f32
  } -> tensor<1x2x4x4xf32> loc("scaled_dot_product_attention.softmax.sub")
  %88 = tensor.empty() : tensor<1x2x4x4xf32> loc("scaled_dot_product_attention.softmax.exp")
  %89 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%83 : tensor<1x2x4x4xf32>) outs(%88 : tensor<1x2x4x4xf32>) {
  ^bb0(%90: f32, %91: f32):
    %92 = math.exp %90 : f32
    linalg.yield %92 : f32
  } -> tensor<1x2x4x4xf32> loc("scaled_dot_product_attention.softmax.exp")
  %93 = tensor.empty() : tensor<1x2x4xf32> loc("scaled_dot_product_attention.softmax.sum")
  %94 = arith.constant 0.0 : f32 loc("scaled_dot_product_attention.softmax.sum")
  %95 = linalg.fill ins(%94 : f32) outs(%93 : tensor<1x2x4xf32>) -> tensor<1x2x4xf32> loc("scaled_dot_product_attention.softmax.sum")
  %96 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%89 : tensor<1x2x4x4xf32>) outs(%95 : tensor<1x2x4xf32>) {
  ^bb0(%97: f32, %98: f32):
    %99 = arith.addf %97, %98 : f32
    linalg.yield %99 : f32
  } -> tensor<1x2x4xf32> loc("scaled_dot_product_attention.softmax.sum")
  %100 = tensor.empty() : tensor<1x2x4x4xf32> loc("scaled_dot_product_attention.softmax.div")
  %101 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%89, %96 : tensor<1x2x4x4xf32>, tensor<1x2x4xf32>) outs(%100 : tensor<1x2x4x4xf32>) {
  ^bb0(%102: f32, %103: f32, %104: f32):
    %105 = arith.divf %102, %103 : f32
    linalg.yield %105 : f32
  } -> tensor<1x2x4x4xf32> loc("scaled_dot_product_attention.softmax.div")
  %106 = tensor.collapse_shape %101 [[0, 1], [2], [3]] : tensor<1x2x4x4xf32> into tensor<2x4x4xf32> loc("scaled_dot_product_attention.lhs")
  %107 = tensor.collapse_shape %v [[0, 1], [2], [3]] : tensor<1x2x4x4xf32> into tensor<2x4x4xf32> loc("scaled_dot_product_attention.rhs")
  %108 = tensor.empty() : tensor<2x4x4xf32> loc("scaled_dot_product_attention")
  %109 = arith.constant 0.0 : f32 loc("scaled_dot_product_attention")
  %110 = linalg.fill ins(%109 : f32) outs(%108 : tensor<2x4x4xf32>) -> tensor<2x4x4xf32> loc("scaled_dot_product_attention")
  %111 = linalg.batch_matmul ins(%106, %107 : tensor<2x4x4xf32>, tensor<2x4x4xf32>) outs(%110 : tensor<2x4x4xf32>) -> tensor<2x4x4xf32> loc("scaled_dot_product_attention")
  %112 = tensor.expand_shape %111 [[0, 1], [2], [3]] output_shape [1, 2, 4, 4] : tensor<2x4x4xf32> into tensor<1x2x4x4xf32> loc("scaled_dot_product_attention.out")
  return %112 : tensor<1x2x4x4xf32>
} loc("rope")

// -----

// The rotated K also returned (a decoder's KV cache holds it): its rotation stays a
// kernel of its own, with the reason (the attention kernel writes only its result, and
// the view of it the return reads is copied out beside the attention); Q's joins.
// CHECK-LABEL: func.func private @fusion_0_loop
// CHECK: tensor.concat dim(3)
// CHECK-LABEL: func.func private @fusion_1_attention
// CHECK: tensor.concat dim(3)
// CHECK-NOT: tensor.concat
// CHECK-LABEL: func.func @rope_k_returned(
// CHECK-NEXT: call @fusion_0_loop
// CHECK-NEXT: call @fusion_1_attention
// REMARK: remark: [opfuse-fuse-attention] fused: add -> scaled_dot_product_attention: {{.*}}(Q prologue: Q computed where the kernel stages it, never written)
// REMARK: remark: [opfuse-fuse-attention] not fused: add_1 -> scaled_dot_product_attention: add_1 is also returned or read elsewhere through add_1.expand_shape, which the attention copies out: the kernel writes only its result
func.func @rope_k_returned(%qp: tensor<1x4x8xf32> loc("qp"), %kp: tensor<1x4x8xf32> loc("kp"), %v: tensor<1x2x4x4xf32> loc("v"), %cos: tensor<1x4x4xf32> loc("cos"), %sin: tensor<1x4x4xf32> loc("sin")) -> (tensor<1x2x4x4xf32>, tensor<1x2x4x4xf32>) {
  %0 = tensor.expand_shape %qp [[0], [1], [2, 3]] output_shape [1, 4, 2, 4] : tensor<1x4x8xf32> into tensor<1x4x2x4xf32> loc("view")
  %1 = tensor.empty() : tensor<1x2x4x4xf32> loc("permute")
  %2 = linalg.transpose ins(%0 : tensor<1x4x2x4xf32>) outs(%1 : tensor<1x2x4x4xf32>) permutation = [0, 2, 1, 3] loc("permute")
  %3 = tensor.expand_shape %kp [[0], [1], [2, 3]] output_shape [1, 4, 2, 4] : tensor<1x4x8xf32> into tensor<1x4x2x4xf32> loc("view_1")
  %4 = tensor.empty() : tensor<1x2x4x4xf32> loc("permute_1")
  %5 = linalg.transpose ins(%3 : tensor<1x4x2x4xf32>) outs(%4 : tensor<1x2x4x4xf32>) permutation = [0, 2, 1, 3] loc("permute_1")
  %6 = tensor.expand_shape %cos [[0], [1, 2], [3]] output_shape [1, 1, 4, 4] : tensor<1x4x4xf32> into tensor<1x1x4x4xf32> loc("unsqueeze")
  %7 = tensor.expand_shape %sin [[0], [1, 2], [3]] output_shape [1, 1, 4, 4] : tensor<1x4x4xf32> into tensor<1x1x4x4xf32> loc("unsqueeze_1")
  %8 = tensor.empty() : tensor<1x2x4x4xf32> loc("mul")
  %9 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, 0, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%2, %6 : tensor<1x2x4x4xf32>, tensor<1x1x4x4xf32>) outs(%8 : tensor<1x2x4x4xf32>) {
  ^bb0(%10: f32, %11: f32, %12: f32):
    %13 = arith.mulf %10, %11 : f32
    linalg.yield %13 : f32
  } -> tensor<1x2x4x4xf32> loc("mul")
  %14 = tensor.extract_slice %2[0, 0, 0, 0][1, 2, 4, 2][1, 1, 1, 1] : tensor<1x2x4x4xf32> to tensor<1x2x4x2xf32> loc("slice_1")
  %15 = tensor.extract_slice %2[0, 0, 0, 2][1, 2, 4, 2][1, 1, 1, 1] : tensor<1x2x4x4xf32> to tensor<1x2x4x2xf32> loc("slice_2")
  %16 = tensor.empty() : tensor<1x2x4x2xf32> loc("neg")
  %17 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%15 : tensor<1x2x4x2xf32>) outs(%16 : tensor<1x2x4x2xf32>) {
  ^bb0(%18: f32, %19: f32):
    %20 = arith.negf %18 : f32
    linalg.yield %20 : f32
  } -> tensor<1x2x4x2xf32> loc("neg")
  %21 = tensor.concat dim(3) %17, %14 : (tensor<1x2x4x2xf32>, tensor<1x2x4x2xf32>) -> tensor<1x2x4x4xf32> loc("cat")
  %22 = tensor.empty() : tensor<1x2x4x4xf32> loc("mul_1")
  %23 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, 0, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%21, %7 : tensor<1x2x4x4xf32>, tensor<1x1x4x4xf32>) outs(%22 : tensor<1x2x4x4xf32>) {
  ^bb0(%24: f32, %25: f32, %26: f32):
    %27 = arith.mulf %24, %25 : f32
    linalg.yield %27 : f32
  } -> tensor<1x2x4x4xf32> loc("mul_1")
  %28 = tensor.empty() : tensor<1x2x4x4xf32> loc("add")
  %29 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%9, %23 : tensor<1x2x4x4xf32>, tensor<1x2x4x4xf32>) outs(%28 : tensor<1x2x4x4xf32>) {
  ^bb0(%30: f32, %31: f32, %32: f32):
    %33 = arith.addf %30, %31 : f32
    linalg.yield %33 : f32
  } -> tensor<1x2x4x4xf32> loc("add")
  %34 = tensor.empty() : tensor<1x2x4x4xf32> loc("mul_2")
  %35 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, 0, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%5, %6 : tensor<1x2x4x4xf32>, tensor<1x1x4x4xf32>) outs(%34 : tensor<1x2x4x4xf32>) {
  ^bb0(%36: f32, %37: f32, %38: f32):
    %39 = arith.mulf %36, %37 : f32
    linalg.yield %39 : f32
  } -> tensor<1x2x4x4xf32> loc("mul_2")
  %40 = tensor.extract_slice %5[0, 0, 0, 0][1, 2, 4, 2][1, 1, 1, 1] : tensor<1x2x4x4xf32> to tensor<1x2x4x2xf32> loc("slice_3")
  %41 = tensor.extract_slice %5[0, 0, 0, 2][1, 2, 4, 2][1, 1, 1, 1] : tensor<1x2x4x4xf32> to tensor<1x2x4x2xf32> loc("slice_4")
  %42 = tensor.empty() : tensor<1x2x4x2xf32> loc("neg_1")
  %43 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%41 : tensor<1x2x4x2xf32>) outs(%42 : tensor<1x2x4x2xf32>) {
  ^bb0(%44: f32, %45: f32):
    %46 = arith.negf %44 : f32
    linalg.yield %46 : f32
  } -> tensor<1x2x4x2xf32> loc("neg_1")
  %47 = tensor.concat dim(3) %43, %40 : (tensor<1x2x4x2xf32>, tensor<1x2x4x2xf32>) -> tensor<1x2x4x4xf32> loc("cat_1")
  %48 = tensor.empty() : tensor<1x2x4x4xf32> loc("mul_3")
  %49 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, 0, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%47, %7 : tensor<1x2x4x4xf32>, tensor<1x1x4x4xf32>) outs(%48 : tensor<1x2x4x4xf32>) {
  ^bb0(%50: f32, %51: f32, %52: f32):
    %53 = arith.mulf %50, %51 : f32
    linalg.yield %53 : f32
  } -> tensor<1x2x4x4xf32> loc("mul_3")
  %54 = tensor.empty() : tensor<1x2x4x4xf32> loc("add_1")
  %55 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%35, %49 : tensor<1x2x4x4xf32>, tensor<1x2x4x4xf32>) outs(%54 : tensor<1x2x4x4xf32>) {
  ^bb0(%56: f32, %57: f32, %58: f32):
    %59 = arith.addf %56, %57 : f32
    linalg.yield %59 : f32
  } -> tensor<1x2x4x4xf32> loc("add_1")
  %60 = tensor.empty() : tensor<1x2x4x4xf32> loc("scaled_dot_product_attention.k_t")
  %61 = linalg.transpose ins(%55 : tensor<1x2x4x4xf32>) outs(%60 : tensor<1x2x4x4xf32>) permutation = [0, 1, 3, 2] loc("scaled_dot_product_attention.k_t")
  %62 = tensor.collapse_shape %29 [[0, 1], [2], [3]] : tensor<1x2x4x4xf32> into tensor<2x4x4xf32> loc("scaled_dot_product_attention.qk.lhs")
  %63 = tensor.collapse_shape %61 [[0, 1], [2], [3]] : tensor<1x2x4x4xf32> into tensor<2x4x4xf32> loc("scaled_dot_product_attention.qk.rhs")
  %64 = tensor.empty() : tensor<2x4x4xf32> loc("scaled_dot_product_attention.qk")
  %65 = arith.constant 0.0 : f32 loc("scaled_dot_product_attention.qk")
  %66 = linalg.fill ins(%65 : f32) outs(%64 : tensor<2x4x4xf32>) -> tensor<2x4x4xf32> loc("scaled_dot_product_attention.qk")
  %67 = linalg.batch_matmul ins(%62, %63 : tensor<2x4x4xf32>, tensor<2x4x4xf32>) outs(%66 : tensor<2x4x4xf32>) -> tensor<2x4x4xf32> loc("scaled_dot_product_attention.qk")
  %68 = tensor.expand_shape %67 [[0, 1], [2], [3]] output_shape [1, 2, 4, 4] : tensor<2x4x4xf32> into tensor<1x2x4x4xf32> loc("scaled_dot_product_attention.qk.out")
  %69 = tensor.empty() : tensor<1x2x4x4xf32> loc("scaled_dot_product_attention.scale")
  %70 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%68 : tensor<1x2x4x4xf32>) outs(%69 : tensor<1x2x4x4xf32>) {
  ^bb0(%71: f32, %72: f32):
    %73 = arith.constant 0.5 : f32
    %74 = arith.mulf %71, %73 : f32
    linalg.yield %74 : f32
  } -> tensor<1x2x4x4xf32> loc("scaled_dot_product_attention.scale")
  %75 = tensor.empty() : tensor<1x2x4xf32> loc("scaled_dot_product_attention.softmax.max")
  %76 = arith.constant 0xFF800000 : f32 loc("scaled_dot_product_attention.softmax.max")
  %77 = linalg.fill ins(%76 : f32) outs(%75 : tensor<1x2x4xf32>) -> tensor<1x2x4xf32> loc("scaled_dot_product_attention.softmax.max")
  %78 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%70 : tensor<1x2x4x4xf32>) outs(%77 : tensor<1x2x4xf32>) {
  ^bb0(%79: f32, %80: f32):
    %81 = arith.maximumf %79, %80 : f32
    linalg.yield %81 : f32
  } -> tensor<1x2x4xf32> loc("scaled_dot_product_attention.softmax.max")
  %82 = tensor.empty() : tensor<1x2x4x4xf32> loc("scaled_dot_product_attention.softmax.sub")
  %83 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%70, %78 : tensor<1x2x4x4xf32>, tensor<1x2x4xf32>) outs(%82 : tensor<1x2x4x4xf32>) {
  ^bb0(%84: f32, %85: f32, %86: f32):
    %87 = arith.subf %84, %85 : f32
    linalg.yield %87 : f32
  } -> tensor<1x2x4x4xf32> loc("scaled_dot_product_attention.softmax.sub")
  %88 = tensor.empty() : tensor<1x2x4x4xf32> loc("scaled_dot_product_attention.softmax.exp")
  %89 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%83 : tensor<1x2x4x4xf32>) outs(%88 : tensor<1x2x4x4xf32>) {
  ^bb0(%90: f32, %91: f32):
    %92 = math.exp %90 : f32
    linalg.yield %92 : f32
  } -> tensor<1x2x4x4xf32> loc("scaled_dot_product_attention.softmax.exp")
  %93 = tensor.empty() : tensor<1x2x4xf32> loc("scaled_dot_product_attention.softmax.sum")
  %94 = arith.constant 0.0 : f32 loc("scaled_dot_product_attention.softmax.sum")
  %95 = linalg.fill ins(%94 : f32) outs(%93 : tensor<1x2x4xf32>) -> tensor<1x2x4xf32> loc("scaled_dot_product_attention.softmax.sum")
  %96 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%89 : tensor<1x2x4x4xf32>) outs(%95 : tensor<1x2x4xf32>) {
  ^bb0(%97: f32, %98: f32):
    %99 = arith.addf %97, %98 : f32
    linalg.yield %99 : f32
  } -> tensor<1x2x4xf32> loc("scaled_dot_product_attention.softmax.sum")
  %100 = tensor.empty() : tensor<1x2x4x4xf32> loc("scaled_dot_product_attention.softmax.div")
  %101 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%89, %96 : tensor<1x2x4x4xf32>, tensor<1x2x4xf32>) outs(%100 : tensor<1x2x4x4xf32>) {
  ^bb0(%102: f32, %103: f32, %104: f32):
    %105 = arith.divf %102, %103 : f32
    linalg.yield %105 : f32
  } -> tensor<1x2x4x4xf32> loc("scaled_dot_product_attention.softmax.div")
  %106 = tensor.collapse_shape %101 [[0, 1], [2], [3]] : tensor<1x2x4x4xf32> into tensor<2x4x4xf32> loc("scaled_dot_product_attention.lhs")
  %107 = tensor.collapse_shape %v [[0, 1], [2], [3]] : tensor<1x2x4x4xf32> into tensor<2x4x4xf32> loc("scaled_dot_product_attention.rhs")
  %108 = tensor.empty() : tensor<2x4x4xf32> loc("scaled_dot_product_attention")
  %109 = arith.constant 0.0 : f32 loc("scaled_dot_product_attention")
  %110 = linalg.fill ins(%109 : f32) outs(%108 : tensor<2x4x4xf32>) -> tensor<2x4x4xf32> loc("scaled_dot_product_attention")
  %111 = linalg.batch_matmul ins(%106, %107 : tensor<2x4x4xf32>, tensor<2x4x4xf32>) outs(%110 : tensor<2x4x4xf32>) -> tensor<2x4x4xf32> loc("scaled_dot_product_attention")
  %112 = tensor.expand_shape %111 [[0, 1], [2], [3]] output_shape [1, 2, 4, 4] : tensor<2x4x4xf32> into tensor<1x2x4x4xf32> loc("scaled_dot_product_attention.out")
  return %112, %55 : tensor<1x2x4x4xf32>, tensor<1x2x4x4xf32>
} loc("rope_k_returned")
