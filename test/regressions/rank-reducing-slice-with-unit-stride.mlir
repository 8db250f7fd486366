// Regression (issue #10, found by test/unit/test_random_linalg.py, seed 98): a
// rank-reducing tensor.extract_slice that drops a dimension of size 1 taken with a stride
// other than 1 aborted the process in the CPU lowering (SIGABRT: memref.subview's
// getDroppedDims assertion, "unable to find unused dims of subview"). The stride of a
// size-1 dimension does not matter; the input contract makes it 1.
// RUN: fuse-run %s --repeat 0 | filecheck %s
// CHECK: #0 {{.*}} ok
// RUN: fuse-opt %s --emit=linalg | filecheck %s --check-prefix=IR
// IR: tensor.extract_slice %arg0[0, 1, 0] [1, 1, 1] [1, 1, 1] : tensor<1x8x1xi32> to tensor<1x1xi32>
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @main(%x: tensor<1x8x1xi32>) -> tensor<1x1xi32> {
  %s = tensor.extract_slice %x[0, 1, 0] [1, 1, 1] [1, 2, 1] : tensor<1x8x1xi32> to tensor<1x1xi32>
  %e = tensor.empty() : tensor<1x1xi32>
  %g = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]} ins(%s : tensor<1x1xi32>) outs(%e : tensor<1x1xi32>) {
  ^bb0(%a: i32, %o: i32):
    %r = arith.addi %a, %a : i32
    linalg.yield %r : i32
  } -> tensor<1x1xi32>
  return %g : tensor<1x1xi32>
}
