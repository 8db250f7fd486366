// Regression: a reduction over every axis (max) and one over the last axis (sum) of the
// same domain were fused into one group, because only the domains were compared. No
// row kernel holds two splits into rows, so the group went to the sequential fallback,
// where every output element recomputed the whole max (quadratic work: a 20,000-element
// case ran for over 15 minutes in the emulator). Found by test/unit/test_random_kernels.py.
// RUN: fuse-opt %s --opfuse-report=text | filecheck %s
// RUN: fuse-opt %s --emit=ptx | filecheck %s --check-prefix=KERNELS
// CHECK: kernels: 3 -> 2
// CHECK: not fused [fuse-reduction] sub -> sum: reductions over different rows: one row of 2x17x65 vs rows 2x17 of 65 of one domain
// KERNELS: kernel fusion_0_input ({{.*}}emitter rows
// KERNELS: kernel fusion_1_input ({{.*}}emitter rows
// KERNELS-NOT: emitter fallback
module {
  func.func @t(%x: tensor<2x17x65xf32> loc("x")) -> (tensor<2x17x65xf32>, tensor<2x17xf32>) {
    %0 = tensor.empty() : tensor<f32> loc("max")
    %1 = arith.constant 0xFF800000 : f32 loc("max")
    %2 = linalg.fill ins(%1 : f32) outs(%0 : tensor<f32>) -> tensor<f32> loc("max")
    %3 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1, d2)>, affine_map<(d0, d1, d2) -> ()>], iterator_types = ["reduction", "reduction", "reduction"]} ins(%x : tensor<2x17x65xf32>) outs(%2 : tensor<f32>) {
    ^bb0(%4: f32, %5: f32):
      %6 = arith.maximumf %4, %5 : f32
      linalg.yield %6 : f32
    } -> tensor<f32> loc("max")
    %7 = tensor.empty() : tensor<2x17x65xf32> loc("sub")
    %8 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1, d2)>, affine_map<(d0, d1, d2) -> ()>, affine_map<(d0, d1, d2) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel"]} ins(%x, %3 : tensor<2x17x65xf32>, tensor<f32>) outs(%7 : tensor<2x17x65xf32>) {
    ^bb0(%9: f32, %10: f32, %11: f32):
      %12 = arith.subf %9, %10 : f32
      linalg.yield %12 : f32
    } -> tensor<2x17x65xf32> loc("sub")
    %13 = tensor.empty() : tensor<2x17xf32> loc("sum")
    %14 = arith.constant 0.0 : f32 loc("sum")
    %15 = linalg.fill ins(%14 : f32) outs(%13 : tensor<2x17xf32>) -> tensor<2x17xf32> loc("sum")
    %16 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1, d2)>, affine_map<(d0, d1, d2) -> (d0, d1)>], iterator_types = ["parallel", "parallel", "reduction"]} ins(%8 : tensor<2x17x65xf32>) outs(%15 : tensor<2x17xf32>) {
    ^bb0(%17: f32, %18: f32):
      %19 = arith.addf %17, %18 : f32
      linalg.yield %19 : f32
    } -> tensor<2x17xf32> loc("sum")
    return %8, %16 : tensor<2x17x65xf32>, tensor<2x17xf32>
  } loc("t")
}
