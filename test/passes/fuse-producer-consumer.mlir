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

// -----

// RoPE's rotate_half, cat(-x[..., 4:], x[..., :4]) * sin: the slices join their readers,
// the concat its consumer, then the neg (an elementwise producer that only the concat
// reads) joins the concat's group: one loop kernel that computes each negated element
// where the concat reads it. Each slice reads its half of x (2048 B), the kernel all of it.
// CHECK-LABEL: func.func @rotate_half
// CHECK: tensor.extract_slice
// CHECK-SAME: opfuse.group = 0
// CHECK: linalg.negf
// CHECK-SAME: opfuse.group = 0
// CHECK: tensor.extract_slice
// CHECK-SAME: opfuse.group = 0
// CHECK: tensor.concat
// CHECK-SAME: opfuse.group = 0
// CHECK: linalg.mul
// CHECK-SAME: opfuse.group = 0 : i64, opfuse.kind = "loop"
// REMARK: remark: [opfuse-fuse-producer-consumer] fused: cat -> mul: saving 0.40 > delta 0.10
// REMARK: remark: [opfuse-fuse-producer-consumer] fused: neg -> cat: saving 0.25 > delta 0.10
func.func @rotate_half(%x: tensor<2x16x8xf32>, %sin: tensor<2x16x8xf32>) -> tensor<2x16x8xf32> {
  %hi = tensor.extract_slice %x[0, 0, 4] [2, 16, 4] [1, 1, 1] : tensor<2x16x8xf32> to tensor<2x16x4xf32> loc("hi")
  %eh = tensor.empty() : tensor<2x16x4xf32>
  %neg = linalg.negf ins(%hi : tensor<2x16x4xf32>) outs(%eh : tensor<2x16x4xf32>) -> tensor<2x16x4xf32> loc("neg")
  %lo = tensor.extract_slice %x[0, 0, 0] [2, 16, 4] [1, 1, 1] : tensor<2x16x8xf32> to tensor<2x16x4xf32> loc("lo")
  %rot = tensor.concat dim(2) %neg, %lo : (tensor<2x16x4xf32>, tensor<2x16x4xf32>) -> tensor<2x16x8xf32> loc("cat")
  %e = tensor.empty() : tensor<2x16x8xf32>
  %y = linalg.mul ins(%rot, %sin : tensor<2x16x8xf32>, tensor<2x16x8xf32>) outs(%e : tensor<2x16x8xf32>) -> tensor<2x16x8xf32> loc("mul")
  return %y : tensor<2x16x8xf32>
}

// -----

// A producer that is also a result keeps its own kernel: its 2x8 result next to the
// concat's 5x8 would not be one loop kernel.
// CHECK-LABEL: func.func @returned_producer_of_concat
// CHECK: linalg.exp
// CHECK-NOT: opfuse.group
// CHECK: return
func.func @returned_producer_of_concat(%x: tensor<2x8xf32>, %y: tensor<3x8xf32>) -> (tensor<2x8xf32>, tensor<5x8xf32>) {
  %ex = tensor.empty() : tensor<2x8xf32>
  %exp = linalg.exp ins(%x : tensor<2x8xf32>) outs(%ex : tensor<2x8xf32>) -> tensor<2x8xf32> loc("exp")
  %c = tensor.concat dim(0) %exp, %y : (tensor<2x8xf32>, tensor<3x8xf32>) -> tensor<5x8xf32> loc("cat")
  return %exp, %c : tensor<2x8xf32>, tensor<5x8xf32>
}

// -----

// A concat of a matmul's result, returned, is not folded into the matmul's kernel (as a
// reshape would be): the matmul emitter writes tiles of the product, not of the concat.
// CHECK-LABEL: func.func @concat_after_matmul
// CHECK: linalg.matmul
// CHECK-NOT: opfuse.group
// CHECK: return
func.func @concat_after_matmul(%a: tensor<3x4xf32>, %b: tensor<4x8xf32>, %y: tensor<2x8xf32>) -> tensor<5x8xf32> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<3x8xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<3x8xf32>) -> tensor<3x8xf32>
  %m = linalg.matmul ins(%a, %b : tensor<3x4xf32>, tensor<4x8xf32>) outs(%f : tensor<3x8xf32>) -> tensor<3x8xf32> loc("mm")
  %c = tensor.concat dim(0) %m, %y : (tensor<3x8xf32>, tensor<2x8xf32>) -> tensor<5x8xf32> loc("cat")
  return %c : tensor<5x8xf32>
}

// -----

// A reshape that is a result of the function (a training forward saves the attention
// mask as mask[:, None]) joins the loop kernel computing its input, though another kernel
// reads that input too: the loop writes it as one more output, not a copy kernel.
// CHECK-LABEL: func.func @saved_reshape_of_a_loop_result
// CHECK: ins(%arg0 : tensor<2x8x8xf32>) outs(%{{.*}}) attrs = {opfuse.group = 0 : i64}
// CHECK: math.exp
// CHECK: tensor.expand_shape
// CHECK-SAME: opfuse.group = 0 : i64, opfuse.kind = "loop"
// REMARK: remark: [opfuse-fuse-producer-consumer] fused: m -> saved: saving
func.func @saved_reshape_of_a_loop_result(%x: tensor<2x8x8xf32>, %s: tensor<2x4x8x8xf32>) -> (tensor<2x1x8x8xf32>, tensor<2x4x8x8xf32>) {
  %e = tensor.empty() : tensor<2x8x8xf32>
  %m = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1, d2)>, affine_map<(d0, d1, d2) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel"]} ins(%x : tensor<2x8x8xf32>) outs(%e : tensor<2x8x8xf32>) {
  ^bb0(%a: f32, %o: f32):
    %r = math.exp %a : f32
    linalg.yield %r : f32
  } -> tensor<2x8x8xf32> loc("m")
  %e4 = tensor.empty() : tensor<2x4x8x8xf32>
  %y = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%m, %s : tensor<2x8x8xf32>, tensor<2x4x8x8xf32>) outs(%e4 : tensor<2x4x8x8xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %r = arith.mulf %a, %b : f32
    linalg.yield %r : f32
  } -> tensor<2x4x8x8xf32> loc("y")
  %saved = tensor.expand_shape %m [[0, 1], [2], [3]] output_shape [2, 1, 8, 8] : tensor<2x8x8xf32> into tensor<2x1x8x8xf32> loc("saved")
  return %saved, %y : tensor<2x1x8x8xf32>, tensor<2x4x8x8xf32>
}
