// RUN: fuse-opt %s --opfuse-report=text | filecheck %s --check-prefix=REPORT
// RUN: fuse-opt %s --emit=kernels | filecheck %s
// RUN: fuse-opt %s --emit=ptx | filecheck %s --check-prefix=PTX
// RUN: fuse-opt %s --emit=ptx --target=sm_80 | filecheck %s --check-prefix=SM80

// A convolution as torch-mlir prints nn.Conv2d(8, 16, 3, padding=1) + ReLU: the input
// padded by tensor.pad, the bias broadcast into the init, the ReLU as cmpf + select.
// The pad, the bias and the ReLU join the convolution: one "conv" kernel (with the
// reshapes opfuse-fold-unit-dims puts around the pad and the ReLU for the batch of 1).
// REPORT: kernels: 4 -> 1
// REPORT: kernel fusion_0_conv: kind=conv members=8
// REPORT: fused #{{[0-9]+}} [fuse-producer-consumer] tensor.pad@{{.*}} -> tensor.expand_shape@
// REPORT: fused #{{[0-9]+}} [fuse-producer-consumer] linalg.broadcast@{{.*}} -> linalg.conv_2d_nchw_fchw@
// REPORT: fused #{{[0-9]+}} [fuse-epilogue] linalg.conv_2d_nchw_fchw@{{.*}} -> tensor.collapse_shape@

// A thread holds 4 output channels x 4 output columns: 16 x 16 rows x 16 / 4 columns
// / 4 channels = 256 threads, one block. The input channels are an scf.for carrying the 4
// accumulator vectors (initialized from the bias); the 3x3 window is unrolled. Padding
// along the columns (the lanes) is a bounds test per lane: an unsigned compare, a clamped
// load, a select of 0.
// CHECK-LABEL: func.func @fusion_0_conv(
// CHECK-DAG: %[[C256:.*]] = arith.constant 256 : index
// CHECK: gpu.launch blocks({{.*}}) threads({{.*}}) in ({{.*}} = %[[C256]],
// CHECK: memref.load %{{.*}} : memref<16xf32>
// CHECK: scf.for %{{.*}} = %{{.*}} to %{{.*}} step %{{.*}} iter_args({{.*}}) -> (vector<4xf32>, vector<4xf32>, vector<4xf32>, vector<4xf32>)
// CHECK: arith.cmpi ult
// CHECK: arith.minui
// CHECK: arith.select
// CHECK: vector.from_elements {{.*}} : vector<4xf32>
// CHECK: arith.mulf {{.*}} fastmath<contract> : vector<4xf32>
// CHECK: arith.addf {{.*}} fastmath<contract> : vector<4xf32>
// CHECK: scf.yield
// The epilogue on the accumulators, then one aligned 16-byte store per channel.
// CHECK: arith.cmpf ugt, {{.*}} : vector<4xf32>
// CHECK: vector.store {{.*}} {alignment = 16 : i64} : memref<4096xf32>, vector<4xf32>
// CHECK: gpu.terminator
// PTX: // ----- kernel fusion_0_conv (entry fusion_0_conv_kernel, emitter conv, grid [1, 1, 1], block [256, 1, 1])
// PTX: .target sm_90
// PTX: .entry fusion_0_conv_kernel(
// PTX: fma.rn.f32
// PTX: st.global.v4.b32
// SM80: .target sm_80
// SM80: fma.rn.f32
#id = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
func.func @conv_relu(%x: tensor<1x8x16x16xf32>, %w: tensor<16x8x3x3xf32>, %b: tensor<16xf32>) -> tensor<1x16x16x16xf32> {
  %zero = arith.constant 0.0 : f32
  %padded = tensor.pad %x low[0, 0, 1, 1] high[0, 0, 1, 1] {
  ^bb0(%i: index, %j: index, %k: index, %l: index):
    tensor.yield %zero : f32
  } : tensor<1x8x16x16xf32> to tensor<1x8x18x18xf32>
  %e = tensor.empty() : tensor<1x16x16x16xf32>
  %bias = linalg.broadcast ins(%b : tensor<16xf32>) outs(%e : tensor<1x16x16x16xf32>) dimensions = [0, 2, 3]
  %c = linalg.conv_2d_nchw_fchw {dilations = dense<1> : vector<2xi64>, strides = dense<1> : vector<2xi64>}
      ins(%padded, %w : tensor<1x8x18x18xf32>, tensor<16x8x3x3xf32>) outs(%bias : tensor<1x16x16x16xf32>) -> tensor<1x16x16x16xf32>
  %r = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%c : tensor<1x16x16x16xf32>) outs(%e : tensor<1x16x16x16xf32>) {
  ^bb0(%in: f32, %out: f32):
    %p = arith.cmpf ugt, %in, %zero : f32
    %s = arith.select %p, %in, %zero : f32
    linalg.yield %s : f32
  } -> tensor<1x16x16x16xf32>
  return %r : tensor<1x16x16x16xf32>
}
