// --dim-size N compiles an entry function with ? dims (written as IREE's and torch-mlir's
// dynamic exports write them: tensor.dim of an argument, tensor.empty(%d)) at N for every
// ? dim of its arguments; the sizes derived from them fold through the program, and the
// fusion is the static program's.

// RUN: fuse-opt %s --dim-size 5 --opfuse-report=text | filecheck %s --check-prefix=REPORT
// REPORT: kernels: 3 -> 1
// RUN: fuse-opt %s --dim-size 5 | filecheck %s --check-prefix=FUSED
// FUSED: func.func @f(%{{.*}}: tensor<5x5xf32>, %{{.*}}: tensor<5xf32>) -> tensor<5x5xf32>
// FUSED-NOT: tensor<?
// RUN: fuse-run %s --dim-size 7 --repeat 0 | filecheck %s --check-prefix=RUNS
// RUNS: #0 {{.*}}tensor<7x7xf32>{{.*}} ok
// RUN: not fuse-run %s --dim-size 0 2>&1 | filecheck %s --check-prefix=BAD
// BAD: expected a size of 1 or more, got '0'
// RUN: fuse-opt --help | filecheck %s --check-prefix=HELP
// HELP: --dim-size N
func.func @f(%x: tensor<?x?xf32>, %b: tensor<?xf32>) -> tensor<?x?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %d0 = tensor.dim %x, %c0 : tensor<?x?xf32>
  %d1 = tensor.dim %x, %c1 : tensor<?x?xf32>
  %e = tensor.empty(%d0, %d1) : tensor<?x?xf32>
  %y = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (j)>,
                                        affine_map<(i, j) -> (i, j)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%x, %b : tensor<?x?xf32>, tensor<?xf32>) outs(%e : tensor<?x?xf32>) {
  ^bb0(%a: f32, %bb: f32, %o: f32):
    %s = arith.addf %a, %bb : f32
    %t = math.tanh %s : f32
    linalg.yield %t : f32
  } -> tensor<?x?xf32>
  %z = tensor.empty(%d0) : tensor<?xf32>
  %zero = arith.constant 0.0 : f32
  %zf = linalg.fill ins(%zero : f32) outs(%z : tensor<?xf32>) -> tensor<?xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i)>],
                       iterator_types = ["parallel", "reduction"]}
      ins(%y : tensor<?x?xf32>) outs(%zf : tensor<?xf32>) {
  ^bb0(%a: f32, %o: f32):
    %s = arith.addf %a, %o : f32
    linalg.yield %s : f32
  } -> tensor<?xf32>
  %q = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i)>,
                                        affine_map<(i, j) -> (i, j)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%y, %r : tensor<?x?xf32>, tensor<?xf32>) outs(%e : tensor<?x?xf32>) {
  ^bb0(%a: f32, %m: f32, %o: f32):
    %s = arith.divf %a, %m : f32
    linalg.yield %s : f32
  } -> tensor<?x?xf32>
  return %q : tensor<?x?xf32>
}
