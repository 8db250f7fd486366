// Regression: when a reduction (1 op) merged with a larger group over its reduced domain
// (here round-to-f16 + scale, already fused by opfuse-fuse-elementwise), the merged group
// took the small group's domain; later row-domain consumers were then refused and an f16
// layernorm became 6 kernels instead of 1. Written by opfuse.builder (f16 sums accumulate
// in f32, then round).
// RUN: fuse-opt %s --opfuse-report=text | filecheck %s
// CHECK: kernels: 13 -> 1
// CHECK-NOT: not fused [fuse-reduction]
module {
  func.func @layernorm_f16(%x: tensor<8x16xf16> loc("x"), %w: tensor<16xf16> loc("w"), %b: tensor<16xf16> loc("b")) -> (tensor<8x16xf16>) {
    %0 = tensor.empty() : tensor<8xf32> loc("layernorm.mean.sum")
    %1 = arith.constant 0.0 : f32 loc("layernorm.mean.sum")
    %2 = linalg.fill ins(%1 : f32) outs(%0 : tensor<8xf32>) -> tensor<8xf32> loc("layernorm.mean.sum")
    %3 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>], iterator_types = ["parallel", "reduction"]} ins(%x : tensor<8x16xf16>) outs(%2 : tensor<8xf32>) {
    ^bb0(%4: f16, %5: f32):
      %6 = arith.extf %4 : f16 to f32
      %7 = arith.addf %6, %5 : f32
      linalg.yield %7 : f32
    } -> tensor<8xf32> loc("layernorm.mean.sum")
    %8 = tensor.empty() : tensor<8xf16> loc("layernorm.mean.round")
    %9 = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>], iterator_types = ["parallel"]} ins(%3 : tensor<8xf32>) outs(%8 : tensor<8xf16>) {
    ^bb0(%10: f32, %11: f16):
      %12 = arith.truncf %10 : f32 to f16
      linalg.yield %12 : f16
    } -> tensor<8xf16> loc("layernorm.mean.round")
    %13 = tensor.empty() : tensor<8xf16> loc("layernorm.mean.mul")
    %14 = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>], iterator_types = ["parallel"]} ins(%9 : tensor<8xf16>) outs(%13 : tensor<8xf16>) {
    ^bb0(%15: f16, %16: f16):
      %17 = arith.constant 0.0625 : f16
      %18 = arith.mulf %15, %17 : f16
      linalg.yield %18 : f16
    } -> tensor<8xf16> loc("layernorm.mean.mul")
    %19 = tensor.empty() : tensor<8x16xf16> loc("layernorm.sub")
    %20 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%x, %14 : tensor<8x16xf16>, tensor<8xf16>) outs(%19 : tensor<8x16xf16>) {
    ^bb0(%21: f16, %22: f16, %23: f16):
      %24 = arith.subf %21, %22 : f16
      linalg.yield %24 : f16
    } -> tensor<8x16xf16> loc("layernorm.sub")
    %25 = tensor.empty() : tensor<8x16xf16> loc("layernorm.mul")
    %26 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%20, %20 : tensor<8x16xf16>, tensor<8x16xf16>) outs(%25 : tensor<8x16xf16>) {
    ^bb0(%27: f16, %28: f16, %29: f16):
      %30 = arith.mulf %27, %28 : f16
      linalg.yield %30 : f16
    } -> tensor<8x16xf16> loc("layernorm.mul")
    %31 = tensor.empty() : tensor<8xf32> loc("layernorm.mean_1.sum")
    %32 = arith.constant 0.0 : f32 loc("layernorm.mean_1.sum")
    %33 = linalg.fill ins(%32 : f32) outs(%31 : tensor<8xf32>) -> tensor<8xf32> loc("layernorm.mean_1.sum")
    %34 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>], iterator_types = ["parallel", "reduction"]} ins(%26 : tensor<8x16xf16>) outs(%33 : tensor<8xf32>) {
    ^bb0(%35: f16, %36: f32):
      %37 = arith.extf %35 : f16 to f32
      %38 = arith.addf %37, %36 : f32
      linalg.yield %38 : f32
    } -> tensor<8xf32> loc("layernorm.mean_1.sum")
    %39 = tensor.empty() : tensor<8xf16> loc("layernorm.mean_1.round")
    %40 = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>], iterator_types = ["parallel"]} ins(%34 : tensor<8xf32>) outs(%39 : tensor<8xf16>) {
    ^bb0(%41: f32, %42: f16):
      %43 = arith.truncf %41 : f32 to f16
      linalg.yield %43 : f16
    } -> tensor<8xf16> loc("layernorm.mean_1.round")
    %44 = tensor.empty() : tensor<8xf16> loc("layernorm.mean_1.mul")
    %45 = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>], iterator_types = ["parallel"]} ins(%40 : tensor<8xf16>) outs(%44 : tensor<8xf16>) {
    ^bb0(%46: f16, %47: f16):
      %48 = arith.constant 0.0625 : f16
      %49 = arith.mulf %46, %48 : f16
      linalg.yield %49 : f16
    } -> tensor<8xf16> loc("layernorm.mean_1.mul")
    %50 = tensor.empty() : tensor<8xf16> loc("layernorm.add")
    %51 = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>], iterator_types = ["parallel"]} ins(%45 : tensor<8xf16>) outs(%50 : tensor<8xf16>) {
    ^bb0(%52: f16, %53: f16):
      %54 = arith.constant 1.0e-05 : f16
      %55 = arith.addf %52, %54 : f16
      linalg.yield %55 : f16
    } -> tensor<8xf16> loc("layernorm.add")
    %56 = tensor.empty() : tensor<8xf16> loc("layernorm.rsqrt")
    %57 = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>], iterator_types = ["parallel"]} ins(%51 : tensor<8xf16>) outs(%56 : tensor<8xf16>) {
    ^bb0(%58: f16, %59: f16):
      %60 = arith.extf %58 : f16 to f32
      %61 = math.rsqrt %60 : f32
      %62 = arith.truncf %61 : f32 to f16
      linalg.yield %62 : f16
    } -> tensor<8xf16> loc("layernorm.rsqrt")
    %63 = tensor.empty() : tensor<8x16xf16> loc("layernorm.mul_1")
    %64 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%20, %57 : tensor<8x16xf16>, tensor<8xf16>) outs(%63 : tensor<8x16xf16>) {
    ^bb0(%65: f16, %66: f16, %67: f16):
      %68 = arith.mulf %65, %66 : f16
      linalg.yield %68 : f16
    } -> tensor<8x16xf16> loc("layernorm.mul_1")
    %69 = tensor.empty() : tensor<8x16xf16> loc("layernorm.mul_2")
    %70 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%64, %w : tensor<8x16xf16>, tensor<16xf16>) outs(%69 : tensor<8x16xf16>) {
    ^bb0(%71: f16, %72: f16, %73: f16):
      %74 = arith.mulf %71, %72 : f16
      linalg.yield %74 : f16
    } -> tensor<8x16xf16> loc("layernorm.mul_2")
    %75 = tensor.empty() : tensor<8x16xf16> loc("layernorm.add_1")
    %76 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%70, %b : tensor<8x16xf16>, tensor<16xf16>) outs(%75 : tensor<8x16xf16>) {
    ^bb0(%77: f16, %78: f16, %79: f16):
      %80 = arith.addf %77, %78 : f16
      linalg.yield %80 : f16
    } -> tensor<8x16xf16> loc("layernorm.add_1")
    return %76 : tensor<8x16xf16>
  } loc("layernorm_f16")
}
