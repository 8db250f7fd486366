// RUN: fuse-opt %s --split-input-file | filecheck %s
// RUN: fuse-opt %s --split-input-file --opfuse-remarks 2>&1 >/dev/null | filecheck %s --check-prefix=REMARK

// A linear layer's backward: dX = dY·W and dW = dYᵀ·X read dY in two roles (as dX's LHS,
// transposed as dW's), neither reads the other: one kernel, two results of different
// shapes; the transpose is dW's prologue.
// CHECK-LABEL: func.func private @fusion_0_horizontal
// CHECK-SAME: opfuse.kind = "horizontal"
// CHECK: linalg.matmul
// CHECK: linalg.transpose
// CHECK: linalg.matmul
// CHECK-LABEL: func.func @linear_backward
// CHECK: %[[R:.*]]:2 = call @fusion_0_horizontal(%arg0, %arg1, %arg2)
// CHECK-NOT: call
// CHECK: return %[[R]]#0, %[[R]]#1
// REMARK: remark: [opfuse-fuse-grouped] fused: dx -> dw: {{.*}}(2 independent matmuls reading argument 0, one launch)
func.func @linear_backward(%dy: tensor<40x36xf32>, %w: tensor<36x52xf32>, %x: tensor<40x52xf32>)
    -> (tensor<40x52xf32>, tensor<36x52xf32>) {
  %zero = arith.constant 0.0 : f32
  %e0 = tensor.empty() : tensor<40x52xf32>
  %c0 = linalg.fill ins(%zero : f32) outs(%e0 : tensor<40x52xf32>) -> tensor<40x52xf32>
  %dx = linalg.matmul ins(%dy, %w : tensor<40x36xf32>, tensor<36x52xf32>) outs(%c0 : tensor<40x52xf32>) -> tensor<40x52xf32> loc("dx")
  %et = tensor.empty() : tensor<36x40xf32>
  %dyT = linalg.transpose ins(%dy : tensor<40x36xf32>) outs(%et : tensor<36x40xf32>) permutation = [1, 0] loc("dyT")
  %e1 = tensor.empty() : tensor<36x52xf32>
  %c1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<36x52xf32>) -> tensor<36x52xf32>
  %dw = linalg.matmul ins(%dyT, %x : tensor<36x40xf32>, tensor<40x52xf32>) outs(%c1 : tensor<36x52xf32>) -> tensor<36x52xf32> loc("dw")
  return %dx, %dw : tensor<40x52xf32>, tensor<36x52xf32>
}

// -----

// z = (x·W)·xᵀ: both matmuls read x, but z reads y: two kernels.
// CHECK-LABEL: func.func private @fusion_0_output
// CHECK-LABEL: func.func private @fusion_1_output
// CHECK-LABEL: func.func @dependent
// CHECK: call @fusion_0_output
// CHECK: call @fusion_1_output
// REMARK: remark: [opfuse-fuse-grouped] not fused: y -> z: {{.*}}
func.func @dependent(%x: tensor<16x24xf32>, %w: tensor<24x24xf32>) -> tensor<16x16xf32> {
  %zero = arith.constant 0.0 : f32
  %e0 = tensor.empty() : tensor<16x24xf32>
  %c0 = linalg.fill ins(%zero : f32) outs(%e0 : tensor<16x24xf32>) -> tensor<16x24xf32>
  %y = linalg.matmul ins(%x, %w : tensor<16x24xf32>, tensor<24x24xf32>) outs(%c0 : tensor<16x24xf32>) -> tensor<16x24xf32> loc("y")
  %et = tensor.empty() : tensor<24x16xf32>
  %xT = linalg.transpose ins(%x : tensor<16x24xf32>) outs(%et : tensor<24x16xf32>) permutation = [1, 0] loc("xT")
  %e1 = tensor.empty() : tensor<16x16xf32>
  %c1 = linalg.fill ins(%zero : f32) outs(%e1 : tensor<16x16xf32>) -> tensor<16x16xf32>
  %z = linalg.matmul ins(%y, %xT : tensor<16x24xf32>, tensor<24x16xf32>) outs(%c1 : tensor<16x16xf32>) -> tensor<16x16xf32> loc("z")
  return %z : tensor<16x16xf32>
}
