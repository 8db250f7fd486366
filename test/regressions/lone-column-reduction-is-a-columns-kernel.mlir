// RUN: fuse-opt %s --opfuse-report=text | filecheck %s
// RUN: fuse-opt %s --emit=kernels | filecheck %s --check-prefix=GPU

// A column reduction alone in its group (a bias gradient: the output gradient summed over
// the batch) was given the kind "columns" by opfuse-fuse-columns, but single-op groups
// carried no attributes in the IR, so the kind was lost: the kernel was an "input" (row)
// kernel, which the rows emitter refuses ("a reduction over leading dims"), and the GPU
// backend built it with the sequential fallback emitter.
// CHECK: kernel fusion_0_columns: kind=columns members=1
// The column emitter: one thread per kept column, looping over the 32 rows.
// GPU-LABEL: func.func @fusion_0_columns
// GPU: gpu.launch
// GPU: scf.for {{.*}} = %c0 to %c32 step %c1
// GPU: memref.store
#id = affine_map<(d0, d1) -> (d0, d1)>
#col = affine_map<(d0, d1) -> (d1)>
func.func @bias_gradient(%dy: tensor<32x10xf32>) -> tensor<10xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<10xf32>
  %init = linalg.fill ins(%zero : f32) outs(%e : tensor<10xf32>) -> tensor<10xf32>
  %sum = linalg.generic {indexing_maps = [#id, #col], iterator_types = ["reduction", "parallel"]} ins(%dy : tensor<32x10xf32>) outs(%init : tensor<10xf32>) {
  ^bb0(%i: f32, %acc: f32):
    %r = arith.addf %i, %acc : f32
    linalg.yield %r : f32
  } -> tensor<10xf32> loc("bias_grad")
  return %sum : tensor<10xf32>
}
