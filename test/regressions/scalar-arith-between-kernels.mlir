// Regression (issue #10): scalar arithmetic between kernels (an element taken by
// tensor.extract from an earlier op's result, scalar arith/math on it, the scalar used by
// a later generic's payload, a fill and a pad value) made opfuse-outline emit invalid IR
// ("using value defined outside the region", exit 2 with a reproducer). Scalar ops are
// now free, like constants: each kernel that uses the scalar computes it again from the
// tensor, which it takes as an argument; the producer of that tensor never joins the
// consumer's kernel (it must be complete first), and no kernel returns a scalar.
// test/unit/test_scalar_between_kernels.py checks the values against numpy, on the CPU
// and in the GPU emulator, and the kernels with ptxas.
// RUN: fuse-opt %s | filecheck %s
// CHECK: func.func private @fusion_0_input(%arg0: tensor<4x8xf32>) -> tensor<f32>
// CHECK: func.func private @fusion_1_loop(%arg0: tensor<4x8xf32>, %arg1: tensor<f32>) -> tensor<4x8xf32>
// CHECK-NEXT: tensor.extract %arg1[] : tensor<f32>
// CHECK: math.exp
// CHECK: func.func private @fusion_2_loop(%arg0: tensor<3x5xf32>, %arg1: tensor<f32>) -> tensor<6x10xf32>
// CHECK: func.func @main
// CHECK-NEXT: call @fusion_0_input
// CHECK-NEXT: call @fusion_1_loop
// CHECK-NEXT: call @fusion_2_loop
// CHECK-NEXT: return
// RUN: fuse-opt %s --opfuse-report=text | filecheck %s --check-prefix=REPORT
// REPORT: kernels: 4 -> 3
// REPORT: not fused [fuse-reduction] {{.*}}: gathers from its producer's result
// RUN: fuse-run %s --repeat 0 | filecheck %s --check-prefix=EXEC
// EXEC: #0 {{.*}} ok
// EXEC: #1 {{.*}} ok
#id = affine_map<(d0, d1) -> (d0, d1)>
#all = affine_map<(d0, d1) -> ()>
func.func @main(%x: tensor<4x8xf32>, %w: tensor<3x5xf32>) -> (tensor<4x8xf32>, tensor<6x10xf32>) {
  %zero = arith.constant 0.0 : f32
  %e0 = tensor.empty() : tensor<f32>
  %init = linalg.fill ins(%zero : f32) outs(%e0 : tensor<f32>) -> tensor<f32>
  %sum = linalg.generic {indexing_maps = [#id, #all], iterator_types = ["reduction", "reduction"]} ins(%x : tensor<4x8xf32>) outs(%init : tensor<f32>) {
  ^bb0(%a: f32, %acc: f32):
    %t = arith.addf %a, %acc : f32
    linalg.yield %t : f32
  } -> tensor<f32>
  %s = tensor.extract %sum[] : tensor<f32>
  %c = arith.constant 0.03125 : f32
  %mean = arith.mulf %s, %c : f32
  %scale = math.exp %mean : f32
  %e1 = tensor.empty() : tensor<4x8xf32>
  %y = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]} ins(%x : tensor<4x8xf32>) outs(%e1 : tensor<4x8xf32>) {
  ^bb0(%a: f32, %o: f32):
    %d = arith.subf %a, %mean : f32
    %r = arith.mulf %d, %scale : f32
    linalg.yield %r : f32
  } -> tensor<4x8xf32>
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %w12 = tensor.extract %w[%c1, %c2] : tensor<3x5xf32>
  %v = arith.addf %w12, %mean : f32
  %e2 = tensor.empty() : tensor<6x10xf32>
  %filled = linalg.fill ins(%v : f32) outs(%e2 : tensor<6x10xf32>) -> tensor<6x10xf32>
  %pad = tensor.pad %w low[1, 2] high[2, 3] {
  ^bb0(%i: index, %j: index):
    tensor.yield %v : f32
  } : tensor<3x5xf32> to tensor<6x10xf32>
  %e3 = tensor.empty() : tensor<6x10xf32>
  %z = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]} ins(%pad, %filled : tensor<6x10xf32>, tensor<6x10xf32>) outs(%e3 : tensor<6x10xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %r = arith.subf %a, %b : f32
    linalg.yield %r : f32
  } -> tensor<6x10xf32>
  return %y, %z : tensor<4x8xf32>, tensor<6x10xf32>
}
