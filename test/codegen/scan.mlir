// RUN: fuse-opt %s --opfuse-report=text | filecheck %s --check-prefix=REPORT
// RUN: fuse-opt %s --emit=kernels | filecheck %s
// RUN: fuse-opt %s --emit=ptx | filecheck %s --check-prefix=PTX
// RUN: fuse-opt %s --emit=ptx --target=sm_80 | filecheck %s --check-prefix=PTX

// A running sum (cumsum along the rows of 4 x 1000, as the builder and torch's
// aten.cumsum write it: a reduction over a triangular domain) and a scale after it: one
// "scan" kernel, the scale applied to the sums before the store.
// REPORT: kernels: 2 -> 1
// REPORT: kernel fusion_0_scan: kind=scan members=2
// REPORT: fused #{{[0-9]+}} [fuse-scan] cumsum -> mul

// A row per block of 256 threads, 4 consecutive elements per thread (one tile of 1024
// covers the row: the last 24 are masked). Each thread scans its 4 elements in
// registers, the warp scans the thread totals with five shuffles up (lane >= 2^k adds),
// the last lane of each warp publishes the warp total, one barrier, every thread adds
// the totals of the warps before its own, a second barrier; then sum + scale per element.
// CHECK-LABEL: func.func @fusion_0_scan(
// CHECK-DAG: %[[C256:.*]] = arith.constant 256 : index
// CHECK: gpu.launch blocks({{.*}}) threads({{.*}}) in ({{.*}} = %[[C256]], {{.*}} workgroup(%[[SM:.*]] : memref<8xf32, 3>)
// CHECK: arith.minui %{{.*}}, %c999
// CHECK: memref.load %{{.*}} : memref<4000xf32>
// CHECK-COUNT-3: arith.addf
// CHECK: gpu.shuffle  up %{{.*}}, %c1_i32, %c32_i32 : f32
// CHECK: gpu.shuffle  up %{{.*}}, %c2_i32, %c32_i32 : f32
// CHECK: gpu.shuffle  up %{{.*}}, %c4_i32, %c32_i32 : f32
// CHECK: gpu.shuffle  up %{{.*}}, %c8_i32, %c32_i32 : f32
// CHECK: gpu.shuffle  up %{{.*}}, %c16_i32, %c32_i32 : f32
// CHECK: scf.if
// CHECK-NEXT: memref.store %{{.*}}, %[[SM]]
// CHECK: gpu.barrier
// CHECK: memref.load %[[SM]][%c6]
// CHECK: gpu.barrier
// CHECK: scf.if
// CHECK-NEXT: arith.mulf
// CHECK-NEXT: memref.store %{{.*}} : memref<4000xf32>
// CHECK-NOT: scf.for
// CHECK: gpu.terminator
// PTX: // ----- kernel fusion_0_scan (entry fusion_0_scan_kernel, emitter scan, grid [4, 1, 1], block [256, 1, 1])
// PTX: .entry fusion_0_scan_kernel(
// PTX: shfl.sync.up.b32
// PTX: bar.sync 0

module {
  func.func @running(%x: tensor<4x1000xf32> loc("x")) -> (tensor<4x1000xf32>) {
    %0 = tensor.empty() : tensor<4x1000xf32> loc("cumsum")
    %1 = arith.constant 0.0 : f32 loc("cumsum")
    %2 = linalg.fill ins(%1 : f32) outs(%0 : tensor<4x1000xf32>) -> tensor<4x1000xf32> loc("cumsum")
    %3 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d2)>, affine_map<(d0, d1, d2) -> (d0, d1)>], iterator_types = ["parallel", "parallel", "reduction"]} ins(%x : tensor<4x1000xf32>) outs(%2 : tensor<4x1000xf32>) {
    ^bb0(%4: f32, %5: f32):
      %6 = linalg.index 1 : index
      %7 = linalg.index 2 : index
      %8 = arith.cmpi ule, %7, %6 : index
      %9 = arith.addf %5, %4 : f32
      %10 = arith.select %8, %9, %5 : f32
      linalg.yield %10 : f32
    } -> tensor<4x1000xf32> loc("cumsum")
    %11 = tensor.empty() : tensor<4x1000xf32> loc("mul")
    %12 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%3 : tensor<4x1000xf32>) outs(%11 : tensor<4x1000xf32>) {
    ^bb0(%13: f32, %14: f32):
      %15 = arith.constant 0.5 : f32
      %16 = arith.mulf %13, %15 : f32
      linalg.yield %16 : f32
    } -> tensor<4x1000xf32> loc("mul")
    return %12 : tensor<4x1000xf32>
  } loc("running")
}

