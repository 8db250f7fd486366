// RUN: fuse-opt %s --emit=kernels | filecheck %s
// RUN: fuse-opt %s --emit=ptx | filecheck %s --check-prefix=PTX

#id = affine_map<(d0, d1) -> (d0, d1)>
#col = affine_map<(d0, d1) -> (d1)>

// Linear + bias + ReLU: one kernel (opfuse-fuse-epilogue). 16 x 16 threads, each
// accumulating a 4 x 4 tile of C in four vector<4xf32> registers over the K loop; the
// bias and the ReLU are applied to the accumulators, then stored once.
// CHECK-LABEL: func.func @fusion_0_output(
// CHECK: gpu.launch
// CHECK: scf.for {{.*}} iter_args({{.*}}) -> (vector<4xf32>, vector<4xf32>, vector<4xf32>, vector<4xf32>)
// CHECK: arith.mulf {{.*}} fastmath<contract> : vector<4xf32>
// CHECK: arith.addf {{.*}} fastmath<contract> : vector<4xf32>
// CHECK: scf.yield
// CHECK: arith.maximumf
// CHECK: vector.store
// CHECK-NOT: func.func
// PTX: kernel fusion_0_output (entry fusion_0_output_kernel, emitter matmul, grid [3, 2, 1], block [16, 16, 1])
// PTX: fma.rn.f32
// PTX: max.NaN.f32
// PTX: st.global.v4.b32
func.func @linear_relu(%x: tensor<128x64xf32>, %w: tensor<64x192xf32>, %b: tensor<192xf32>) -> tensor<128x192xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<128x192xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<128x192xf32>) -> tensor<128x192xf32>
  %mm = linalg.matmul ins(%x, %w : tensor<128x64xf32>, tensor<64x192xf32>) outs(%f : tensor<128x192xf32>) -> tensor<128x192xf32>
  %y = linalg.generic {indexing_maps = [#id, #col, #id], iterator_types = ["parallel", "parallel"]}
      ins(%mm, %b : tensor<128x192xf32>, tensor<192xf32>) outs(%e : tensor<128x192xf32>) {
  ^bb0(%i: f32, %j: f32, %o: f32):
    %s = arith.addf %i, %j : f32
    %r = arith.maximumf %s, %zero : f32
    linalg.yield %r : f32
  } -> tensor<128x192xf32>
  return %y : tensor<128x192xf32>
}
