// With --entry, the input contract checks only what the entry reaches: a file that mixes a
// static function with dynamic ones (IREE's and torch-mlir's test files do) compiles its
// static one. Without --entry the dynamic sibling is refused, located.

// RUN: fuse-run %s --entry static --repeat 0 | filecheck %s --check-prefix=OK
// OK: fuse-run: {{.*}}entry-reach.mlir @static on cpu
// OK: #0 {{.*}} ok
// RUN: not fuse-run %s --repeat 0 2>&1 | filecheck %s --check-prefix=ALL
// ALL: entry-reach.mlir:11:1: error: dynamic shapes are compiled at given sizes (--dim-size N{{.*}}): argument 0 of @dynamic

func.func @dynamic(%x: tensor<?x8xf32>) -> tensor<?x8xf32> {
  return %x : tensor<?x8xf32>
}

func.func @static(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %e = tensor.empty() : tensor<4x8xf32>
  %y = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<4x8xf32>) outs(%e : tensor<4x8xf32>) {
  ^bb0(%a: f32, %o: f32):
    %t = math.tanh %a : f32
    linalg.yield %t : f32
  } -> tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}
