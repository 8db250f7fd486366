// Regression (found by test_random_linalg.py, seeds 30, 39, 58, after opfuse-fold-unit-dims
// joined the default pipeline): a named op whose body uses a value defined outside it (here
// a function-level constant; the fold's canonicalization hoists a body's constants there)
// made the op analysis's scratch copy invalid ("'arith.mulf' op using value defined outside
// the region"): every pass after the fold failed, exit 1 without a location. The copy now
// takes captured values as arguments too. Numerics: test_random_program_regressions.py.
// RUN: fuse-opt %s --emit=kernels | filecheck %s
// RUN: fuse-run %s | filecheck %s --check-prefix=JIT
// CHECK: func.func @fusion_0_loop
// CHECK: arith.mulf
// JIT: #0{{ +}}tensor<1x4x1xf32>{{.*}}ok
func.func @main(%a: tensor<1x4x1xf32>, %b: tensor<1x4x1xf32>) -> tensor<1x4x1xf32> {
  %four = arith.constant 4.0 : f32
  %e = tensor.empty() : tensor<1x4x1xf32>
  %m = linalg.map ins(%a, %b : tensor<1x4x1xf32>, tensor<1x4x1xf32>) outs(%e : tensor<1x4x1xf32>)
    (%x: f32, %y: f32, %o: f32) {
      %s = arith.mulf %x, %four : f32
      %t = arith.addf %s, %y : f32
      linalg.yield %t : f32
    }
  return %m : tensor<1x4x1xf32>
}
