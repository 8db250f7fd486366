// RUN: fuse-opt %s --split-input-file --opfuse-fuse-producer-consumer | filecheck %s
// RUN: fuse-opt %s --split-input-file --opfuse-fuse-producer-consumer --opfuse-remarks 2>&1 >/dev/null | filecheck %s --check-prefix=REMARK
// RUN: fuse-opt %s --split-input-file --opfuse-fuse-producer-consumer="max-duplicates=1" --opfuse-remarks 2>&1 >/dev/null | filecheck %s --check-prefix=NODUP

// A transpose is read directly by its only consumer: one group.
// CHECK-LABEL: func.func @transpose_into_consumer
// CHECK: linalg.transpose
// CHECK-SAME: opfuse.group = 0
// CHECK: linalg.exp
// CHECK-SAME: opfuse.group = 0 : i64, opfuse.kind = "loop"
// REMARK: remark: [opfuse-fuse-producer-consumer] fused: t -> e: saving 0.50 > delta 0.10
func.func @transpose_into_consumer(%x: tensor<64x32xf32>) -> tensor<32x64xf32> {
  %et = tensor.empty() : tensor<32x64xf32>
  %t = linalg.transpose ins(%x : tensor<64x32xf32>) outs(%et : tensor<32x64xf32>) permutation = [1, 0] loc("t")
  %e = linalg.exp ins(%t : tensor<32x64xf32>) outs(%et : tensor<32x64xf32>) -> tensor<32x64xf32> loc("e")
  return %e : tensor<32x64xf32>
}

// -----

// A broadcast read by two consumers: re-reading its 512-byte input in each consumer beats
// writing the 64 KiB result once and reading it back twice, so each consumer gets a copy
// (and then fuses with it). With max-duplicates=1 it stays a kernel of its own.
// CHECK-LABEL: func.func @broadcast_two_consumers
// CHECK: linalg.broadcast
// CHECK-SAME: opfuse.group = 0
// CHECK: linalg.add
// CHECK-SAME: opfuse.group = 0 : i64, opfuse.kind = "loop"
// CHECK: linalg.broadcast
// CHECK-SAME: opfuse.group = 1
// CHECK: linalg.mul
// CHECK-SAME: opfuse.group = 1 : i64, opfuse.kind = "loop"
// REMARK: remark: [opfuse-fuse-producer-consumer] fused: b -> add: recompute moves 1024 B < round trip 196608 B
// REMARK: remark: [opfuse-fuse-producer-consumer] fused: b -> mul: recompute moves 1024 B < round trip 196608 B
// NODUP: remark: [opfuse-fuse-producer-consumer] not fused: b -> add: too many consumers (2 > max-duplicates 1)
// NODUP: remark: [opfuse-fuse-producer-consumer] not fused: b -> mul: too many consumers (2 > max-duplicates 1)
func.func @broadcast_two_consumers(%v: tensor<128xf32>, %x: tensor<128x128xf32>) -> (tensor<128x128xf32>, tensor<128x128xf32>) {
  %e = tensor.empty() : tensor<128x128xf32>
  %b = linalg.broadcast ins(%v : tensor<128xf32>) outs(%e : tensor<128x128xf32>) dimensions = [0] loc("b")
  %0 = linalg.add ins(%x, %b : tensor<128x128xf32>, tensor<128x128xf32>) outs(%e : tensor<128x128xf32>) -> tensor<128x128xf32> loc("add")
  %1 = linalg.mul ins(%x, %b : tensor<128x128xf32>, tensor<128x128xf32>) outs(%e : tensor<128x128xf32>) -> tensor<128x128xf32> loc("mul")
  return %0, %1 : tensor<128x128xf32>, tensor<128x128xf32>
}

// -----

// A reshape of a matmul's result, returned: done by the matmul's kernel.
// CHECK-LABEL: func.func @reshape_after_matmul
// CHECK: linalg.matmul
// CHECK-SAME: opfuse.group = 0 : i64, opfuse.kind = "output"
// CHECK: tensor.expand_shape
// CHECK-SAME: opfuse.group = 0
// REMARK: remark: [opfuse-fuse-producer-consumer] fused: mm -> r: saving 0.36 > delta 0.10
func.func @reshape_after_matmul(%a: tensor<16x32xf32>, %b: tensor<32x64xf32>) -> tensor<16x8x8xf32> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<16x64xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<16x64xf32>) -> tensor<16x64xf32>
  %m = linalg.matmul ins(%a, %b : tensor<16x32xf32>, tensor<32x64xf32>) outs(%f : tensor<16x64xf32>) -> tensor<16x64xf32> loc("mm")
  %r = tensor.expand_shape %m [[0], [1, 2]] output_shape [16, 8, 8] : tensor<16x64xf32> into tensor<16x8x8xf32> loc("r")
  return %r : tensor<16x8x8xf32>
}
