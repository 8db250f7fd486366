// RUN: fuse-opt %s --emit=kernels | filecheck %s
// RUN: fuse-opt %s --emit=ptx | filecheck %s --check-prefix=PTX
// RUN: fuse-opt %s --emit=ptx --target=sm_80 | filecheck %s --check-prefix=SM80

#id = affine_map<(d0, d1) -> (d0, d1)>
#col = affine_map<(d0, d1) -> (d1)>

// An elementwise chain with a row-vector operand: one loop kernel. Each thread takes one
// 16-byte vector (4 x f32), 256 threads per block, 64 x 512 / 4 / 256 = 32 blocks; the
// column operand is read as a vector too (its index is the thread's column).
// CHECK-LABEL: func.func @fusion_0_loop(%{{.*}}: memref<32768xf32>, %{{.*}}: memref<512xf32>, %{{.*}}: memref<32768xf32>)
// CHECK-DAG: %[[GRID:.*]] = arith.constant 32 : index
// CHECK-DAG: %[[BLOCK:.*]] = arith.constant 256 : index
// CHECK: gpu.launch blocks({{.*}}) in ({{.*}} = %[[GRID]], {{.*}}) threads({{.*}}) in ({{.*}} = %[[BLOCK]],
// CHECK: vector.load {{.*}} {alignment = 16 : i64} : memref<32768xf32>, vector<4xf32>
// CHECK: vector.load {{.*}} {alignment = 16 : i64} : memref<512xf32>, vector<4xf32>
// CHECK: math.tanh {{.*}} : vector<4xf32>
// CHECK: vector.store {{.*}} {alignment = 16 : i64} : memref<32768xf32>, vector<4xf32>
// CHECK: gpu.terminator
// PTX: // ----- kernel fusion_0_loop (entry fusion_0_loop_kernel, emitter loop, grid [32, 1, 1], block [256, 1, 1])
// PTX: .target sm_90
// PTX: .entry fusion_0_loop_kernel(
// PTX-COUNT-2: ld.global.nc.v4.b32
// PTX: st.global.v4.b32
// SM80: .target sm_80
func.func @chain(%x: tensor<64x512xf32>, %a: tensor<512xf32>) -> tensor<64x512xf32> {
  %e = tensor.empty() : tensor<64x512xf32>
  %m = linalg.generic {indexing_maps = [#id, #col, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x, %a : tensor<64x512xf32>, tensor<512xf32>) outs(%e : tensor<64x512xf32>) {
  ^bb0(%i: f32, %j: f32, %o: f32):
    %r = arith.mulf %i, %j : f32
    linalg.yield %r : f32
  } -> tensor<64x512xf32>
  %t = linalg.tanh ins(%m : tensor<64x512xf32>) outs(%e : tensor<64x512xf32>) -> tensor<64x512xf32>
  return %t : tensor<64x512xf32>
}
