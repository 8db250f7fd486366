// Regression: a transpose and the reshape of it each had two consumers; the duplication
// step cloned the transpose into its consumers and erased it, then planned the reshape
// from the stale graph, whose reads still named the erased transpose: the process crashed
// (segmentation fault; Phi and GPT-NeoX under torch.compile). A mover that read one
// duplicated in the same round now waits for the next round.
// RUN: fuse-opt %s --opfuse-report=text | filecheck %s
// RUN: fuse-run %s | filecheck %s --check-prefix=RESULT
// CHECK: kernels: 5 -> 3
// CHECK: decision add: fused #{{[0-9]+}} (duplicate) [fuse-producer-consumer] r -> add
// RESULT-COUNT-3: ok
module {
  func.func @mover_chain(%x: tensor<4x8xf32> loc("x")) -> (tensor<8x4xf32>, tensor<32xf32>, tensor<32xf32>) {
    %0 = tensor.empty() : tensor<8x4xf32> loc("t")
    %1 = linalg.transpose ins(%x : tensor<4x8xf32>) outs(%0 : tensor<8x4xf32>) permutation = [1, 0] loc("t")
    %2 = tensor.collapse_shape %1 [[0, 1]] : tensor<8x4xf32> into tensor<32xf32> loc("r")
    %3 = tensor.empty() : tensor<8x4xf32> loc("mul")
    %4 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%1 : tensor<8x4xf32>) outs(%3 : tensor<8x4xf32>) {
    ^bb0(%5: f32, %6: f32):
      %7 = arith.constant 2.0 : f32
      %8 = arith.mulf %5, %7 : f32
      linalg.yield %8 : f32
    } -> tensor<8x4xf32> loc("mul")
    %9 = tensor.empty() : tensor<32xf32> loc("add")
    %10 = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>], iterator_types = ["parallel"]} ins(%2 : tensor<32xf32>) outs(%9 : tensor<32xf32>) {
    ^bb0(%11: f32, %12: f32):
      %13 = arith.constant 1.0 : f32
      %14 = arith.addf %11, %13 : f32
      linalg.yield %14 : f32
    } -> tensor<32xf32> loc("add")
    %15 = tensor.empty() : tensor<32xf32> loc("mul_1")
    %16 = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>], iterator_types = ["parallel"]} ins(%2 : tensor<32xf32>) outs(%15 : tensor<32xf32>) {
    ^bb0(%17: f32, %18: f32):
      %19 = arith.constant 3.0 : f32
      %20 = arith.mulf %17, %19 : f32
      linalg.yield %20 : f32
    } -> tensor<32xf32> loc("mul_1")
    return %4, %10, %16 : tensor<8x4xf32>, tensor<32xf32>, tensor<32xf32>
  } loc("mover_chain")
}
