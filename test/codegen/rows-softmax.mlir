// RUN: fuse-opt %s --split-input-file --emit=ptx | filecheck %s

#id = affine_map<(d0, d1) -> (d0, d1)>
#rowv = affine_map<(d0, d1) -> (d0)>

// Softmax over rows of 4096: one block of 256 threads per row, each thread holding four
// 16-byte vectors of its row in registers: 4 loads and 4 stores per thread (the row is
// read once), two reductions, each a warp butterfly (5 shuffles) and one exchange
// between the 8 warps through shared memory.
// CHECK: kernel fusion_0_input (entry fusion_0_input_kernel, emitter rows, grid [16, 1, 1], block [256, 1, 1])
// CHECK: .shared .align 16 .b8
// CHECK-COUNT-4: ld.global.nc.v4.b32
// CHECK-COUNT-5: shfl.sync.bfly.b32
// CHECK: bar.sync
// CHECK-COUNT-5: shfl.sync.bfly.b32
// CHECK: bar.sync
// CHECK-COUNT-4: st.global.v4.b32
func.func @softmax(%x: tensor<16x4096xf32>) -> tensor<16x4096xf32> {
  %ninf = arith.constant 0xFF800000 : f32
  %zero = arith.constant 0.0 : f32
  %er = tensor.empty() : tensor<16xf32>
  %fm = linalg.fill ins(%ninf : f32) outs(%er : tensor<16xf32>) -> tensor<16xf32>
  %m = linalg.generic {indexing_maps = [#id, #rowv], iterator_types = ["parallel", "reduction"]}
      ins(%x : tensor<16x4096xf32>) outs(%fm : tensor<16xf32>) {
  ^bb0(%i: f32, %acc: f32):
    %r = arith.maximumf %i, %acc : f32
    linalg.yield %r : f32
  } -> tensor<16xf32>
  %e = tensor.empty() : tensor<16x4096xf32>
  %ex = linalg.generic {indexing_maps = [#id, #rowv, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x, %m : tensor<16x4096xf32>, tensor<16xf32>) outs(%e : tensor<16x4096xf32>) {
  ^bb0(%i: f32, %j: f32, %o: f32):
    %d = arith.subf %i, %j : f32
    %r = math.exp %d : f32
    linalg.yield %r : f32
  } -> tensor<16x4096xf32>
  %fs = linalg.fill ins(%zero : f32) outs(%er : tensor<16xf32>) -> tensor<16xf32>
  %s = linalg.generic {indexing_maps = [#id, #rowv], iterator_types = ["parallel", "reduction"]}
      ins(%ex : tensor<16x4096xf32>) outs(%fs : tensor<16xf32>) {
  ^bb0(%i: f32, %acc: f32):
    %r = arith.addf %i, %acc : f32
    linalg.yield %r : f32
  } -> tensor<16xf32>
  %y = linalg.generic {indexing_maps = [#id, #rowv, #id], iterator_types = ["parallel", "parallel"]}
      ins(%ex, %s : tensor<16x4096xf32>, tensor<16xf32>) outs(%e : tensor<16x4096xf32>) {
  ^bb0(%i: f32, %j: f32, %o: f32):
    %r = arith.divf %i, %j : f32
    linalg.yield %r : f32
  } -> tensor<16x4096xf32>
  return %y : tensor<16x4096xf32>
}

// -----

#id = affine_map<(d0, d1) -> (d0, d1)>
#rowv = affine_map<(d0, d1) -> (d0)>

// Short rows (256 floats = 64 vectors): a warp per row, 8 rows per block of 32 x 8
// threads, two vectors per thread; shuffles only (no shared memory, no barrier).
// CHECK: kernel fusion_0_input (entry fusion_0_input_kernel, emitter rows, grid [8, 1, 1], block [32, 8, 1])
// CHECK-NOT: bar.sync
// CHECK-COUNT-5: shfl.sync.bfly.b32
// CHECK-NOT: bar.sync
// CHECK: st.global.b32
func.func @row_sums(%x: tensor<64x256xf32>) -> tensor<64xf32> {
  %zero = arith.constant 0.0 : f32
  %er = tensor.empty() : tensor<64xf32>
  %fs = linalg.fill ins(%zero : f32) outs(%er : tensor<64xf32>) -> tensor<64xf32>
  %s = linalg.generic {indexing_maps = [#id, #rowv], iterator_types = ["parallel", "reduction"]}
      ins(%x : tensor<64x256xf32>) outs(%fs : tensor<64xf32>) {
  ^bb0(%i: f32, %acc: f32):
    %sq = arith.mulf %i, %i : f32
    %r = arith.addf %sq, %acc : f32
    linalg.yield %r : f32
  } -> tensor<64xf32>
  return %s : tensor<64xf32>
}
