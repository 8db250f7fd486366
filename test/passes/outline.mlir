// RUN: fuse-opt %s --split-input-file --opfuse-outline | filecheck %s
// RUN: fuse-opt %s --split-input-file --opfuse-fuse-elementwise --opfuse-outline | filecheck %s --check-prefix=FUSED

// Unfused: every op becomes a kernel of its own; the host keeps only calls, and free ops
// (tensor.empty, fills, constants) are cloned into the kernels that use them.
// CHECK-LABEL: func.func private @fusion_0_loop(%{{.*}}: tensor<8x16xf32>) -> tensor<8x16xf32>
// CHECK-SAME: opfuse.bytes_read = 512 : i64, opfuse.bytes_written = 512 : i64, opfuse.flops = 128 : i64, opfuse.kernel, opfuse.kind = "loop", opfuse.ops = 1 : i64
// CHECK: tensor.empty
// CHECK: linalg.exp
// CHECK: func.func private @fusion_1_loop
// CHECK: linalg.add
// CHECK: func.func private @fusion_2_input
// CHECK: arith.constant
// CHECK: linalg.fill
// CHECK: linalg.reduce
// CHECK-LABEL: func.func @two_outputs
// CHECK-NEXT: %[[E:.*]] = call @fusion_0_loop(%arg0)
// CHECK-NEXT: %[[A:.*]] = call @fusion_1_loop(%[[E]], %arg0)
// CHECK-NEXT: %[[R:.*]] = call @fusion_2_input(%[[E]])
// CHECK-NEXT: return %[[A]], %[[R]]

// Fused: exp and add are one kernel with two results (exp's value is also reduced).
// FUSED-LABEL: func.func private @fusion_0_loop(%{{.*}}: tensor<8x16xf32>) -> (tensor<8x16xf32>, tensor<8x16xf32>)
// FUSED-SAME: opfuse.ops = 2
// FUSED: linalg.exp
// FUSED: linalg.add
// FUSED: func.func private @fusion_1_input
// FUSED-LABEL: func.func @two_outputs
// FUSED-NEXT: %[[K:.*]]:2 = call @fusion_0_loop(%arg0)
// FUSED-NEXT: %[[R:.*]] = call @fusion_1_input(%[[K]]#0)
// FUSED-NEXT: return %[[K]]#1, %[[R]]
func.func @two_outputs(%x: tensor<8x16xf32>) -> (tensor<8x16xf32>, tensor<8xf32>) {
  %e = tensor.empty() : tensor<8x16xf32>
  %a = linalg.exp ins(%x : tensor<8x16xf32>) outs(%e : tensor<8x16xf32>) -> tensor<8x16xf32>
  %b = linalg.add ins(%a, %x : tensor<8x16xf32>, tensor<8x16xf32>) outs(%e : tensor<8x16xf32>) -> tensor<8x16xf32>
  %z = arith.constant 0.0 : f32
  %er = tensor.empty() : tensor<8xf32>
  %f = linalg.fill ins(%z : f32) outs(%er : tensor<8xf32>) -> tensor<8xf32>
  %s = linalg.reduce ins(%a : tensor<8x16xf32>) outs(%f : tensor<8xf32>) dimensions = [1]
    (%in: f32, %acc: f32) {
      %r = arith.addf %in, %acc : f32
      linalg.yield %r : f32
    }
  return %b, %s : tensor<8x16xf32>, tensor<8xf32>
}

// -----

// Bodies that use values from outside their op (a gather's tensor.extract, a scalar of the
// function) are walked: the kernel takes the tensor as an argument and a copy of the
// scalar, with the other free ops in host order; a body that uses only its arguments
// (negf's) has nothing else to give its kernel.
// CHECK-LABEL: func.func private @fusion_0_loop
// CHECK-SAME: (%[[I:[^:]*]]: tensor<8xi64>, %[[T:[^:]*]]: tensor<16xf32>) -> tensor<8xf32>
// CHECK-NEXT: %[[C:.*]] = arith.constant 2.0
// CHECK-NEXT: %[[E:.*]] = tensor.empty() : tensor<8xf32>
// CHECK-NEXT: linalg.generic {{.*}} ins(%[[I]] : tensor<8xi64>) outs(%[[E]] : tensor<8xf32>)
// CHECK: tensor.extract %[[T]]
// CHECK-NEXT: arith.mulf %{{.*}}, %[[C]]
// CHECK-LABEL: func.func private @fusion_1_loop
// CHECK-SAME: (%{{[^:]*}}: tensor<8xf32>) -> tensor<8xf32>
// CHECK-NEXT: tensor.empty() : tensor<8xf32>
// CHECK-NEXT: linalg.generic
// CHECK-LABEL: func.func @captures
// CHECK-NEXT: %[[G:.*]] = call @fusion_0_loop(%arg1, %arg0)
// CHECK-NEXT: call @fusion_1_loop(%[[G]])
func.func @captures(%t: tensor<16xf32>, %i: tensor<8xi64>) -> tensor<8xf32> {
  %c = arith.constant 2.0 : f32
  %e = tensor.empty() : tensor<8xf32>
  %g = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>], iterator_types = ["parallel"]} ins(%i : tensor<8xi64>) outs(%e : tensor<8xf32>) {
  ^bb0(%k: i64, %o: f32):
    %j = arith.index_cast %k : i64 to index
    %v = tensor.extract %t[%j] : tensor<16xf32>
    %m = arith.mulf %v, %c : f32
    linalg.yield %m : f32
  } -> tensor<8xf32>
  %h = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>], iterator_types = ["parallel"]} ins(%g : tensor<8xf32>) outs(%e : tensor<8xf32>) {
  ^bb0(%a: f32, %o: f32):
    %n = arith.negf %a : f32
    linalg.yield %n : f32
  } -> tensor<8xf32>
  return %h : tensor<8xf32>
}
