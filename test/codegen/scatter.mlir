// RUN: fuse-opt %s --opfuse-report=text | filecheck %s --check-prefix=REPORT
// RUN: fuse-opt %s --emit=kernels | filecheck %s
// RUN: fuse-opt %s --emit=ptx | filecheck %s --check-prefix=PTX
// RUN: fuse-opt %s --emit=ptx --target=sm_80 | filecheck %s --check-prefix=PTX

// An embedding's gradient as the builder's scatter_add and torch's
// embedding_dense_backward write it: the rows loop d0 (100 rows) is read by no input, the
// reduction loops d2, d3 run over the 4 x 16 token ids, and the payload adds the update
// where the id is the row (and not the padding id 0). As written that is 100 x 32 x 64
// additions; recognized, it is a "scatter" kernel of 64 x 32 threads, one per update, and
// the elementwise op computing the updates joins it (opfuse-fuse-column-sums).
// REPORT: kernels: 2 -> 1
// REPORT: kernel fusion_0_scatter: kind=scatter members=2 flops=12.3 kFLOP
// REPORT: fused #1 [fuse-column-sums] mul -> scatter_add

// One thread per (token, column), the column innermost: the id is loaded, checked against
// the rows (an id outside them adds nothing), and the update (with the padding test) is
// added atomically at row id; no loop over the rows.
// CHECK-LABEL: func.func @fusion_0_scatter(
// CHECK-DAG: %[[ROWS:.*]] = arith.constant 100 : i64
// CHECK: gpu.launch blocks({{.*}}) in ({{.*}} = %c8, {{.*}}) threads({{.*}}) in ({{.*}} = %c256,
// CHECK: %[[ID:.*]] = memref.load %{{.*}} : memref<64xi64>
// CHECK: arith.cmpi sge, %[[ID]]
// CHECK: arith.cmpi slt, %[[ID]], %[[ROWS]]
// CHECK: arith.index_cast %[[ID]] : i64 to index
// CHECK: scf.if
// CHECK: arith.cmpi ne, %[[ID]]
// CHECK: memref.load %{{.*}} : memref<2048xf32>
// CHECK-NEXT: arith.mulf
// CHECK: memref.atomic_rmw addf %{{.*}} : (f32, memref<3200xf32>) -> f32
// CHECK-NOT: scf.for
// CHECK: gpu.terminator
// PTX: // ----- kernel fusion_0_scatter (entry fusion_0_scatter_kernel, emitter scatter, grid [8, 1, 1], block [256, 1, 1])
// PTX: atom.global.add.f32

module {
  func.func @embedding_grad(%dy: tensor<4x16x32xf32> loc("dy"), %ids: tensor<4x16xi64> loc("ids")) -> (tensor<100x32xf32>) {
    %0 = tensor.empty() : tensor<4x16x32xf32> loc("mul")
    %1 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1, d2)>, affine_map<(d0, d1, d2) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel"]} ins(%dy : tensor<4x16x32xf32>) outs(%0 : tensor<4x16x32xf32>) {
    ^bb0(%2: f32, %3: f32):
      %4 = arith.constant 0.5 : f32
      %5 = arith.mulf %2, %4 : f32
      linalg.yield %5 : f32
    } -> tensor<4x16x32xf32> loc("mul")
    %6 = tensor.empty() : tensor<100x32xf32> loc("scatter_add")
    %7 = arith.constant 0.0 : f32 loc("scatter_add")
    %8 = linalg.fill ins(%7 : f32) outs(%6 : tensor<100x32xf32>) -> tensor<100x32xf32> loc("scatter_add")
    %9 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d2, d3, d1)>, affine_map<(d0, d1, d2, d3) -> (d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1)>], iterator_types = ["parallel", "parallel", "reduction", "reduction"]} ins(%1, %ids : tensor<4x16x32xf32>, tensor<4x16xi64>) outs(%8 : tensor<100x32xf32>) {
    ^bb0(%10: f32, %11: i64, %12: f32):
      %13 = linalg.index 0 : index
      %14 = arith.index_cast %13 : index to i64
      %15 = arith.cmpi eq, %11, %14 : i64
      %16 = arith.constant 0 : i64
      %17 = arith.cmpi ne, %11, %16 : i64
      %18 = arith.andi %15, %17 : i1
      %19 = arith.constant 0.0 : f32
      %20 = arith.select %18, %10, %19 : f32
      %21 = arith.addf %12, %20 : f32
      linalg.yield %21 : f32
    } -> tensor<100x32xf32> loc("scatter_add")
    return %9 : tensor<100x32xf32>
  } loc("embedding_grad")
}

