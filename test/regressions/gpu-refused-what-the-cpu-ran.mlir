// Regression (issue #10): the GPU path refused programs the CPU backend ran: weights as
// dense_resource constants ("a dense non-splat constant inside a kernel"), a returned
// linalg.fill ("'linalg.fill' in the host function"), a scalar read inside a body ("scalar
// kernel arguments"; outlining it even produced invalid IR, exit 2), tensor.pad and
// tensor.insert_slice ("inside a kernel"), cf.assert in a body (vectorized into invalid
// IR, exit 2). Each now gets its kernels; numerics: test/unit/test_codegen_parity.py.
// RUN: fuse-opt %s --split-input-file --emit=kernels | filecheck %s

// CHECK-LABEL: func.func @fusion_0_loop(%{{.*}}: memref<32xf32>)
// CHECK: arith.constant dense<1.500000e+00> : vector<4xf32>
// CHECK: vector.store
func.func @returned_fill() -> tensor<4x8xf32> {
  %c = arith.constant 1.5 : f32
  %e = tensor.empty() : tensor<4x8xf32>
  %f = linalg.fill ins(%c : f32) outs(%e : tensor<4x8xf32>) -> tensor<4x8xf32>
  return %f : tensor<4x8xf32>
}

// -----

// The scalar is computed again in the kernel that uses it, from the 0-d tensor it reads
// (one kernel: no kernel of its own, no scalar passed between kernels).
// CHECK-LABEL: func.func @fusion_0_loop(%{{.*}}: memref<32xf32>, %{{.*}}: memref<1xf32>, %{{.*}}: memref<32xf32>)
// CHECK: memref.load %{{.*}} : memref<1xf32>
// CHECK-NOT: @fusion_1_
func.func @scalar(%x: tensor<4x8xf32>, %s: tensor<f32>) -> tensor<4x8xf32> {
  %v = tensor.extract %s[] : tensor<f32>
  %e = tensor.empty() : tensor<4x8xf32>
  %y = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%x : tensor<4x8xf32>) outs(%e : tensor<4x8xf32>) {
  ^bb0(%a: f32, %o: f32):
    %m = arith.mulf %a, %v : f32
    linalg.yield %m : f32
  } -> tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}

// -----

// A pad in a loop kernel: bounds tests and clamped loads, no branch.
// CHECK-LABEL: func.func @fusion_0_loop(%{{.*}}: memref<32xf32>, %{{.*}}: memref<66xf32>)
// CHECK: arith.cmpi ult
// CHECK: arith.minui
// CHECK: arith.select
func.func @pad(%x: tensor<4x8xf32>) -> tensor<6x11xf32> {
  %p = arith.constant -0.5 : f32
  %padded = tensor.pad %x low[1, 2] high[1, 1] {
  ^bb0(%i: index, %j: index):
    tensor.yield %p : f32
  } : tensor<4x8xf32> to tensor<6x11xf32>
  %e = tensor.empty() : tensor<6x11xf32>
  %y = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%padded : tensor<6x11xf32>) outs(%e : tensor<6x11xf32>) {
  ^bb0(%a: f32, %o: f32):
    %m = math.exp %a : f32
    linalg.yield %m : f32
  } -> tensor<6x11xf32>
  return %y : tensor<6x11xf32>
}

// -----

// An assertion in a body is not in the kernel (fuse-opt --emit=cubin's notes say so).
// CHECK-LABEL: func.func @fusion_0_loop(
// CHECK-NOT: cf.assert
// CHECK: math.exp {{.*}} : vector<4xf32>
func.func @assert(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %e = tensor.empty() : tensor<4x8xf32>
  %big = arith.constant 1.0e30 : f32
  %y = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%x : tensor<4x8xf32>) outs(%e : tensor<4x8xf32>) {
  ^bb0(%a: f32, %o: f32):
    %ok = arith.cmpf olt, %a, %big : f32
    cf.assert %ok, "x must be below 1e30"
    %m = math.exp %a : f32
    linalg.yield %m : f32
  } -> tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}

// -----

// (last: a resource section ends the file)
// CHECK-LABEL: func.func @fusion_0_loop(%{{.*}}: memref<32xf32>, %{{.*}}: memref<8xf32>, %{{.*}}: memref<32xf32>)
// CHECK: gpu.launch
// CHECK: vector.load {{.*}} : memref<8xf32>, vector<4xf32>
module {
func.func @weights(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %w = arith.constant dense_resource<w8> : tensor<8xf32>
  %e = tensor.empty() : tensor<4x8xf32>
  %y = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%x, %w : tensor<4x8xf32>, tensor<8xf32>) outs(%e : tensor<4x8xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %m = arith.mulf %a, %b : f32
    linalg.yield %m : f32
  } -> tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}
}
{-#
  dialect_resources: {
    builtin: {
      w8: "0x040000000000803F0000004000004040000080400000A0400000C0400000E04000000041"
    }
  }
#-}

