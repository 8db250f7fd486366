// RUN: fuse-opt %s --split-input-file --emit=kernels | filecheck %s
// RUN: fuse-opt %s --split-input-file --emit=ptx | filecheck %s --check-prefix=PTX

#id = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#tab = affine_map<(d0, d1, d2) -> (d1, d2)>

// RoPE, x * cos + rotate_half(x) * sin with rotate_half(x) = cat(-x[..., 32:], x[..., :32]):
// one loop kernel. The halves are multiples of the 4-lane vector, so each thread's vector
// lies in one half: an scf.if on its first column picks the half, and each branch reads x
// as one aligned vector inside that half's bounds.
// CHECK-LABEL: func.func @fusion_0_loop(
// CHECK: gpu.launch
// CHECK: %[[HALF:.*]] = scf.if %{{.*}} -> (vector<4xf32>) {
// CHECK:   vector.load {{.*}} {alignment = 16 : i64} : memref<8192xf32>, vector<4xf32>
// CHECK:   arith.negf {{.*}} : vector<4xf32>
// CHECK: } else {
// CHECK:   vector.load {{.*}} {alignment = 16 : i64} : memref<8192xf32>, vector<4xf32>
// CHECK: }
// CHECK: arith.mulf %[[HALF]], {{.*}} : vector<4xf32>
// CHECK: vector.store {{.*}} {alignment = 16 : i64} : memref<8192xf32>, vector<4xf32>
// CHECK-NOT: func.func @fusion_1
// PTX: kernel fusion_0_loop (entry fusion_0_loop_kernel, emitter loop, grid [8, 1, 1], block [256, 1, 1])
// PTX: ld.global.nc.v4.b32
// PTX: st.global.v4.b32
func.func @rope(%x: tensor<2x64x64xf32>, %cos: tensor<64x64xf32>, %sin: tensor<64x64xf32>) -> tensor<2x64x64xf32> {
  %hi = tensor.extract_slice %x[0, 0, 32] [2, 64, 32] [1, 1, 1] : tensor<2x64x64xf32> to tensor<2x64x32xf32>
  %eh = tensor.empty() : tensor<2x64x32xf32>
  %neg = linalg.negf ins(%hi : tensor<2x64x32xf32>) outs(%eh : tensor<2x64x32xf32>) -> tensor<2x64x32xf32>
  %lo = tensor.extract_slice %x[0, 0, 0] [2, 64, 32] [1, 1, 1] : tensor<2x64x64xf32> to tensor<2x64x32xf32>
  %rot = tensor.concat dim(2) %neg, %lo : (tensor<2x64x32xf32>, tensor<2x64x32xf32>) -> tensor<2x64x64xf32>
  %e = tensor.empty() : tensor<2x64x64xf32>
  %y = linalg.generic {indexing_maps = [#id, #tab, #id, #tab, #id], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%x, %cos, %rot, %sin : tensor<2x64x64xf32>, tensor<64x64xf32>, tensor<2x64x64xf32>, tensor<64x64xf32>) outs(%e : tensor<2x64x64xf32>) {
  ^bb0(%a: f32, %c: f32, %r: f32, %s: f32, %o: f32):
    %ac = arith.mulf %a, %c : f32
    %rs = arith.mulf %r, %s : f32
    %sum = arith.addf %ac, %rs : f32
    linalg.yield %sum : f32
  } -> tensor<2x64x64xf32>
  return %y : tensor<2x64x64xf32>
}

// -----

// Widths 3 and 5 along the vector dim: a boundary falls inside a thread's 4 lanes, so
// each lane picks its input on its own (a scalar scf.if per lane, in bounds either way)
// and the lanes are gathered into one vector for the store.
// CHECK-LABEL: func.func @fusion_0_loop(
// CHECK-COUNT-4: scf.if %{{.*}} -> (f32) {
// CHECK: vector.from_elements {{.*}} : vector<4xf32>
// CHECK: vector.store
func.func @odd_widths(%a: tensor<4x3xf32>, %b: tensor<4x5xf32>) -> tensor<4x8xf32> {
  %c = tensor.concat dim(1) %a, %b : (tensor<4x3xf32>, tensor<4x5xf32>) -> tensor<4x8xf32>
  %e = tensor.empty() : tensor<4x8xf32>
  %y = linalg.exp ins(%c : tensor<4x8xf32>) outs(%e : tensor<4x8xf32>) -> tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}
