// RUN: fuse-opt %s --disable-pass=opfuse-fuse-columns --emit=kernels | filecheck %s

#id = affine_map<(d0, d1) -> (d0, d1)>
#colv = affine_map<(d0, d1) -> (d1)>

// A column reduction left a plain reduction group ("input": opfuse-fuse-columns, which
// makes it a "columns" kernel, is off here) has no emitter that takes it: the fallback
// runs a grid-stride loop over the 48 outputs (one block of 64 threads, never one
// thread), each summing its column sequentially.
// CHECK-LABEL: func.func @fusion_0_input(
// CHECK-DAG: %[[ONE:.*]] = arith.constant 1 : index
// CHECK-DAG: %[[T:.*]] = arith.constant 64 : index
// CHECK: gpu.launch blocks({{.*}}) in ({{.*}} = %[[ONE]], {{.*}}) threads({{.*}}) in ({{.*}} = %[[T]],
// CHECK: scf.for
// CHECK: scf.for {{.*}} iter_args
// CHECK: arith.addf
// CHECK: memref.store
func.func @colsum(%x: tensor<64x48xf32>) -> tensor<48xf32> {
  %zero = arith.constant 0.0 : f32
  %er = tensor.empty() : tensor<48xf32>
  %fs = linalg.fill ins(%zero : f32) outs(%er : tensor<48xf32>) -> tensor<48xf32>
  %s = linalg.generic {indexing_maps = [#id, #colv], iterator_types = ["reduction", "parallel"]}
      ins(%x : tensor<64x48xf32>) outs(%fs : tensor<48xf32>) {
  ^bb0(%i: f32, %acc: f32):
    %r = arith.addf %i, %acc : f32
    linalg.yield %r : f32
  } -> tensor<48xf32>
  return %s : tensor<48xf32>
}
