// RUN: fuse-opt %s --opfuse-report=text | filecheck %s
// RUN: fuse-opt %s --disable-pass=opfuse-fuse-scan --opfuse-report=text | filecheck %s --check-prefix=OFF

// opfuse-fuse-scan: a scan (cumsum, recognized from its triangular reduction) takes the
// loop groups over its domain on both sides. RoBERTa's position ids from token ids:
// (cumsum((ids != 1).int(), 1) * mask).long() + 1: the mask it counts and the
// arithmetic after it join the scan, one kernel (without the pass: the mask, the scan,
// the arithmetic: 3).
// CHECK-LABEL: kernels: 9 -> 4
// CHECK: kernel fusion_0_scan: kind=scan members=6 flops=162 FLOP
// CHECK: kernel fusion_1_scan: kind=scan members=1
// CHECK: kernel fusion_2_input: kind=input members=1
// CHECK: kernel fusion_3_scan: kind=scan members=1
// A reduction after a scan needs whole sums: neither pass merges them; nor two scans.
// CHECK: not fused [fuse-reduction] cumsum_1 -> sum: a scan group is not fused here
// CHECK: fused #{{[0-9]+}} [fuse-scan] cast -> cumsum
// CHECK: fused #{{[0-9]+}} [fuse-scan] cumsum -> mul
// CHECK: not fused [fuse-scan] cumsum_1 -> sum: a 'input' group is not fused with a scan
// CHECK: not fused [fuse-scan] cumsum_1 -> cumsum_2: two scans: one scan per kernel
// OFF: kernels: 9 -> 6

module {
  func.func @positions(%ids: tensor<2x9xi64> loc("ids")) -> (tensor<2x9xi64>) {
    %0 = tensor.empty() : tensor<2x9xi8> loc("ne")
    %1 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%ids : tensor<2x9xi64>) outs(%0 : tensor<2x9xi8>) {
    ^bb0(%2: i64, %3: i8):
      %4 = arith.constant 1 : i64
      %5 = arith.cmpi ne, %2, %4 : i64
      %6 = arith.extui %5 : i1 to i8
      linalg.yield %6 : i8
    } -> tensor<2x9xi8> loc("ne")
    %7 = tensor.empty() : tensor<2x9xi32> loc("cast")
    %8 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%1 : tensor<2x9xi8>) outs(%7 : tensor<2x9xi32>) {
    ^bb0(%9: i8, %10: i32):
      %11 = arith.extui %9 : i8 to i32
      linalg.yield %11 : i32
    } -> tensor<2x9xi32> loc("cast")
    %12 = tensor.empty() : tensor<2x9xi32> loc("cumsum")
    %13 = arith.constant 0 : i32 loc("cumsum")
    %14 = linalg.fill ins(%13 : i32) outs(%12 : tensor<2x9xi32>) -> tensor<2x9xi32> loc("cumsum")
    %15 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d2)>, affine_map<(d0, d1, d2) -> (d0, d1)>], iterator_types = ["parallel", "parallel", "reduction"]} ins(%8 : tensor<2x9xi32>) outs(%14 : tensor<2x9xi32>) {
    ^bb0(%16: i32, %17: i32):
      %18 = linalg.index 1 : index
      %19 = linalg.index 2 : index
      %20 = arith.cmpi ule, %19, %18 : index
      %21 = arith.addi %17, %16 : i32
      %22 = arith.select %20, %21, %17 : i32
      linalg.yield %22 : i32
    } -> tensor<2x9xi32> loc("cumsum")
    %23 = tensor.empty() : tensor<2x9xi32> loc("mul")
    %24 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%15, %8 : tensor<2x9xi32>, tensor<2x9xi32>) outs(%23 : tensor<2x9xi32>) {
    ^bb0(%25: i32, %26: i32, %27: i32):
      %28 = arith.muli %25, %26 : i32
      linalg.yield %28 : i32
    } -> tensor<2x9xi32> loc("mul")
    %29 = tensor.empty() : tensor<2x9xi64> loc("cast_1")
    %30 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%24 : tensor<2x9xi32>) outs(%29 : tensor<2x9xi64>) {
    ^bb0(%31: i32, %32: i64):
      %33 = arith.extsi %31 : i32 to i64
      linalg.yield %33 : i64
    } -> tensor<2x9xi64> loc("cast_1")
    %34 = tensor.empty() : tensor<2x9xi64> loc("add")
    %35 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%30 : tensor<2x9xi64>) outs(%34 : tensor<2x9xi64>) {
    ^bb0(%36: i64, %37: i64):
      %38 = arith.constant 1 : i64
      %39 = arith.addi %36, %38 : i64
      linalg.yield %39 : i64
    } -> tensor<2x9xi64> loc("add")
    return %35 : tensor<2x9xi64>
  } loc("positions")
  func.func @scan_then_sum(%x: tensor<8x16xf32> loc("x")) -> (tensor<8xf32>, tensor<8x16xf32>) {
    %0 = tensor.empty() : tensor<8x16xf32> loc("cumsum_1")
    %1 = arith.constant 0.0 : f32 loc("cumsum_1")
    %2 = linalg.fill ins(%1 : f32) outs(%0 : tensor<8x16xf32>) -> tensor<8x16xf32> loc("cumsum_1")
    %3 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d2)>, affine_map<(d0, d1, d2) -> (d0, d1)>], iterator_types = ["parallel", "parallel", "reduction"]} ins(%x : tensor<8x16xf32>) outs(%2 : tensor<8x16xf32>) {
    ^bb0(%4: f32, %5: f32):
      %6 = linalg.index 1 : index
      %7 = linalg.index 2 : index
      %8 = arith.cmpi ule, %7, %6 : index
      %9 = arith.addf %5, %4 : f32
      %10 = arith.select %8, %9, %5 : f32
      linalg.yield %10 : f32
    } -> tensor<8x16xf32> loc("cumsum_1")
    %11 = tensor.empty() : tensor<8xf32> loc("sum")
    %12 = arith.constant 0.0 : f32 loc("sum")
    %13 = linalg.fill ins(%12 : f32) outs(%11 : tensor<8xf32>) -> tensor<8xf32> loc("sum")
    %14 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>], iterator_types = ["parallel", "reduction"]} ins(%3 : tensor<8x16xf32>) outs(%13 : tensor<8xf32>) {
    ^bb0(%15: f32, %16: f32):
      %17 = arith.addf %15, %16 : f32
      linalg.yield %17 : f32
    } -> tensor<8xf32> loc("sum")
    %18 = tensor.empty() : tensor<8x16xf32> loc("cumsum_2")
    %19 = arith.constant 0.0 : f32 loc("cumsum_2")
    %20 = linalg.fill ins(%19 : f32) outs(%18 : tensor<8x16xf32>) -> tensor<8x16xf32> loc("cumsum_2")
    %21 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d2, d1)>, affine_map<(d0, d1, d2) -> (d0, d1)>], iterator_types = ["parallel", "parallel", "reduction"]} ins(%3 : tensor<8x16xf32>) outs(%20 : tensor<8x16xf32>) {
    ^bb0(%22: f32, %23: f32):
      %24 = linalg.index 0 : index
      %25 = linalg.index 2 : index
      %26 = arith.cmpi ule, %25, %24 : index
      %27 = arith.addf %23, %22 : f32
      %28 = arith.select %26, %27, %23 : f32
      linalg.yield %28 : f32
    } -> tensor<8x16xf32> loc("cumsum_2")
    return %14, %21 : tensor<8xf32>, tensor<8x16xf32>
  } loc("scan_then_sum")
}
