// RUN: fuse-opt %s --emit=bundle -o %t.opfuse
// RUN: %PYTHON %S/Inputs/run_bundle.py %t.opfuse | filecheck %s
// RUN: %expect-exit 1 fuse-opt %s --emit=bundle
// RUN: not fuse-opt %s --emit=bundle 2>&1 | filecheck %s --check-prefix=ERR

// An AOT bundle runs on the CPU in a process that never imports mlir.
// CHECK: kernels: fusion_0_loop
// CHECK: output 0: shape (2, 4) [1.0, 3.0, 5.0, 7.0, 9.0, 11.0, 13.0, 15.0]
// CHECK: mlir imported: False
// ERR: error: --emit=bundle writes one binary file: give -o FILE
func.func @affine(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %two = arith.constant 2.0 : f32
  %one = arith.constant 1.0 : f32
  %e = tensor.empty() : tensor<2x4xf32>
  %y = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<2x4xf32>) outs(%e : tensor<2x4xf32>) {
  ^bb0(%i: f32, %o: f32):
    %m = arith.mulf %i, %two : f32
    %r = arith.addf %m, %one : f32
    linalg.yield %r : f32
  } -> tensor<2x4xf32>
  return %y : tensor<2x4xf32>
}
