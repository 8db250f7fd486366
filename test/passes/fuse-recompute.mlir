// RUN: fuse-opt %s --split-input-file --opfuse-fuse-elementwise --opfuse-fuse-recompute | filecheck %s
// RUN: fuse-opt %s --split-input-file --opfuse-fuse-elementwise --opfuse-fuse-recompute --opfuse-remarks 2>&1 >/dev/null | filecheck %s --check-prefix=REMARK
// RUN: fuse-opt %s --split-input-file --opfuse-fuse-elementwise --opfuse-fuse-recompute="delta=0.6" --opfuse-remarks 2>&1 >/dev/null | filecheck %s --check-prefix=DELTA
// RUN: fuse-opt %s --split-input-file --opfuse-fuse-elementwise --opfuse-fuse-recompute="max-copies=1" --opfuse-remarks 2>&1 >/dev/null | filecheck %s --check-prefix=COPIES
// The default pipeline: kernels per function.
// RUN: fuse-opt %s --split-input-file --opfuse-report=text | filecheck %s --check-prefix=KERNELS

#id2 = affine_map<(d0, d1) -> (d0, d1)>
#id3 = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#rows = affine_map<(d0, d1, d2) -> (d0, d1)>
#bcast0 = affine_map<(d0, d1, d2) -> (0, d1, d2)>

// Position ids (arange + 3 over 1x8) read by the position embedding over 1x8x16, which is
// added to the token embedding of a batch of 2 (2x8x16) through a broadcast: both small
// producers are computed again in the sum's kernel, one after the other (the latest first),
// and erased. The elementwise pass refuses them: iteration spaces differ.
// CHECK-LABEL: func.func @position_embeddings
// CHECK: linalg.generic {{.*}} ins(%arg0 {{.*}}opfuse.group = [[G:[0-9]+]]
// CHECK: linalg.generic {{.*}} outs({{.*}}tensor<1x8xi64>) {{.*}}opfuse.group = [[G]]
// CHECK: linalg.generic {{.*}}opfuse.group = [[G]]
// CHECK: linalg.generic {{.*}}opfuse.group = [[G]] : i64, opfuse.kind = "loop"
// CHECK-NOT: linalg.generic
// CHECK: return
// REMARK: remark: [opfuse-fuse-elementwise] not fused: pos_emb -> sum: iteration spaces differ: 1x8x16 vs 2x8x16
// REMARK: remark: [opfuse-fuse-recompute] fused: pos_emb -> sum: time saving 0.50 > delta 0.10 (W +{{[0-9]+}} flops, Q -1024 B), R_fused
// REMARK: remark: [opfuse-fuse-recompute] fused: pos_ids -> pos_emb: time saving 0.50 > delta 0.10 (W +{{[0-9]+}} flops, Q -128 B), R_fused
// DELTA: remark: [opfuse-fuse-recompute] not fused: pos_emb -> sum: time saving 0.50 <= delta 0.60
// KERNELS: kernels: 4 -> 1
func.func @position_embeddings(%ids: tensor<2x8xi64>, %wte: tensor<50x16xf32>, %wpe: tensor<64x16xf32>) -> tensor<2x8x16xf32> {
  %tok_e = tensor.empty() : tensor<2x8x16xf32>
  %tok = linalg.generic {indexing_maps = [#rows, #id3], iterator_types = ["parallel", "parallel", "parallel"]} ins(%ids : tensor<2x8xi64>) outs(%tok_e : tensor<2x8x16xf32>) {
  ^bb0(%i: i64, %o: f32):
    %lo = arith.constant 0 : i64
    %hi = arith.constant 49 : i64
    %c = arith.minsi %i, %hi : i64
    %c2 = arith.maxsi %c, %lo : i64
    %r = arith.index_cast %c2 : i64 to index
    %d = linalg.index 2 : index
    %x = tensor.extract %wte[%r, %d] : tensor<50x16xf32>
    linalg.yield %x : f32
  } -> tensor<2x8x16xf32> loc("tok_emb")
  %pe = tensor.empty() : tensor<1x8xi64>
  %pos = linalg.generic {indexing_maps = [#id2], iterator_types = ["parallel", "parallel"]} outs(%pe : tensor<1x8xi64>) {
  ^bb0(%o: i64):
    %j = linalg.index 1 : index
    %j64 = arith.index_cast %j : index to i64
    %three = arith.constant 3 : i64
    %p = arith.addi %j64, %three : i64
    linalg.yield %p : i64
  } -> tensor<1x8xi64> loc("pos_ids")
  %pos_e = tensor.empty() : tensor<1x8x16xf32>
  %pemb = linalg.generic {indexing_maps = [#rows, #id3], iterator_types = ["parallel", "parallel", "parallel"]} ins(%pos : tensor<1x8xi64>) outs(%pos_e : tensor<1x8x16xf32>) {
  ^bb0(%i: i64, %o: f32):
    %lo = arith.constant 0 : i64
    %hi = arith.constant 63 : i64
    %c = arith.minsi %i, %hi : i64
    %c2 = arith.maxsi %c, %lo : i64
    %r = arith.index_cast %c2 : i64 to index
    %d = linalg.index 2 : index
    %x = tensor.extract %wpe[%r, %d] : tensor<64x16xf32>
    linalg.yield %x : f32
  } -> tensor<1x8x16xf32> loc("pos_emb")
  %sum = linalg.generic {indexing_maps = [#id3, #bcast0, #id3], iterator_types = ["parallel", "parallel", "parallel"]} ins(%tok, %pemb : tensor<2x8x16xf32>, tensor<1x8x16xf32>) outs(%tok_e : tensor<2x8x16xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %s = arith.addf %a, %b : f32
    linalg.yield %s : f32
  } -> tensor<2x8x16xf32> loc("sum")
  return %sum : tensor<2x8x16xf32>
}

// -----

// A causal mask built from two aranges (1x8x8, it reads nothing) and read by two 2x8x8
// consumers through a broadcast: each computes its own copy and the mask kernel goes.
// With max-copies=1 it stays a kernel of its own, read back by both.
// CHECK-LABEL: func.func @shared_generator
// CHECK-NOT: loc("causal")
// CHECK: linalg.generic {{.*}}opfuse.group = [[A:[0-9]+]]
// CHECK: linalg.generic {{.*}}opfuse.group = [[A]] : i64, opfuse.kind = "loop"
// CHECK: linalg.generic {{.*}}opfuse.group = [[B:[0-9]+]]
// CHECK: linalg.generic {{.*}}opfuse.group = [[B]] : i64, opfuse.kind = "loop"
// REMARK: remark: [opfuse-fuse-recompute] fused: causal -> masked_a: time saving 0.33 > delta 0.10
// REMARK: remark: [opfuse-fuse-recompute] fused: causal -> masked_b: time saving 0.33 > delta 0.10
// COPIES: remark: [opfuse-fuse-recompute] not fused: causal -> masked_a: too many consumers (2 > max-copies 1)
// KERNELS: kernels: 3 -> 2
#id3 = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#bcast0 = affine_map<(d0, d1, d2) -> (0, d1, d2)>
func.func @shared_generator(%x: tensor<2x8x8xf32>, %y: tensor<2x8x8xf32>) -> (tensor<2x8x8xf32>, tensor<2x8x8xf32>) {
  %me = tensor.empty() : tensor<1x8x8xi8>
  %xe = tensor.empty() : tensor<2x8x8xf32>
  %m = linalg.generic {indexing_maps = [#id3], iterator_types = ["parallel", "parallel", "parallel"]} outs(%me : tensor<1x8x8xi8>) {
  ^bb0(%o: i8):
    %i = linalg.index 1 : index
    %j = linalg.index 2 : index
    %ge = arith.cmpi uge, %i, %j : index
    %b = arith.extui %ge : i1 to i8
    linalg.yield %b : i8
  } -> tensor<1x8x8xi8> loc("causal")
  %a = linalg.generic {indexing_maps = [#id3, #bcast0, #id3], iterator_types = ["parallel", "parallel", "parallel"]} ins(%x, %m : tensor<2x8x8xf32>, tensor<1x8x8xi8>) outs(%xe : tensor<2x8x8xf32>) {
  ^bb0(%v: f32, %k: i8, %o: f32):
    %zero = arith.constant 0 : i8
    %keep = arith.cmpi ne, %k, %zero : i8
    %ninf = arith.constant -1.0e9 : f32
    %r = arith.select %keep, %v, %ninf : f32
    linalg.yield %r : f32
  } -> tensor<2x8x8xf32> loc("masked_a")
  %b = linalg.generic {indexing_maps = [#id3, #bcast0, #id3], iterator_types = ["parallel", "parallel", "parallel"]} ins(%y, %m : tensor<2x8x8xf32>, tensor<1x8x8xi8>) outs(%xe : tensor<2x8x8xf32>) {
  ^bb0(%v: f32, %k: i8, %o: f32):
    %zero = arith.constant 0 : i8
    %keep = arith.cmpi ne, %k, %zero : i8
    %r = arith.select %keep, %v, %v : f32
    linalg.yield %r : f32
  } -> tensor<2x8x8xf32> loc("masked_b")
  return %a, %b : tensor<2x8x8xf32>, tensor<2x8x8xf32>
}

// -----

// A vector (v * 2 over 64 elements) that is returned and read by a 64x64 consumer through a
// broadcast: the producer stays a kernel (it is returned), and a copy in the consumer would
// read v instead of the result, as many bytes, for more flops: refused.
// CHECK-LABEL: func.func @kept_producer
// CHECK-NOT: opfuse.group
// REMARK: remark: [opfuse-fuse-recompute] not fused: scaled -> add: time saving 0.00 <= delta 0.10 (W +4096 flops, Q +0 B)
// KERNELS: kernels: 2 -> 2
#v1 = affine_map<(d0) -> (d0)>
#id2 = affine_map<(d0, d1) -> (d0, d1)>
func.func @kept_producer(%v: tensor<64xf32>, %x: tensor<64x64xf32>) -> (tensor<64xf32>, tensor<64x64xf32>) {
  %ve = tensor.empty() : tensor<64xf32>
  %xe = tensor.empty() : tensor<64x64xf32>
  %s = linalg.generic {indexing_maps = [#v1, #v1], iterator_types = ["parallel"]} ins(%v : tensor<64xf32>) outs(%ve : tensor<64xf32>) {
  ^bb0(%a: f32, %o: f32):
    %two = arith.constant 2.0 : f32
    %m = arith.mulf %a, %two : f32
    linalg.yield %m : f32
  } -> tensor<64xf32> loc("scaled")
  %add = linalg.generic {indexing_maps = [#id2, affine_map<(d0, d1) -> (d1)>, #id2], iterator_types = ["parallel", "parallel"]} ins(%x, %s : tensor<64x64xf32>, tensor<64xf32>) outs(%xe : tensor<64x64xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %r = arith.addf %a, %b : f32
    linalg.yield %r : f32
  } -> tensor<64x64xf32> loc("add")
  return %s, %add : tensor<64xf32>, tensor<64x64xf32>
}

// -----

// A gather from a cast (HF's attention_mask.to(bool)[batch, kv]): the cast cannot join the
// gather's kernel as a tensor (the gather reads it at data-dependent positions), so the
// gather extracts the i64 mask and compares it where it reads: one kernel, no cast left.
// CHECK-LABEL: func.func @gathered_cast
// CHECK-NOT: arith.cmpi ne
// CHECK: linalg.generic
// CHECK: %[[M:.*]] = tensor.extract %arg0[
// CHECK: arith.cmpi ne, %[[M]]
// CHECK: return
// REMARK: remark: [opfuse-fuse-recompute] fused: to_bool -> padding: time saving
// KERNELS: kernels: 2 -> 1
#id2 = affine_map<(d0, d1) -> (d0, d1)>
func.func @gathered_cast(%mask: tensor<2x8xi64>, %kv: tensor<8xi64>) -> tensor<2x8xi8> {
  %be = tensor.empty() : tensor<2x8xi8>
  %b = linalg.generic {indexing_maps = [#id2, #id2], iterator_types = ["parallel", "parallel"]} ins(%mask : tensor<2x8xi64>) outs(%be : tensor<2x8xi8>) {
  ^bb0(%m: i64, %o: i8):
    %zero = arith.constant 0 : i64
    %ne = arith.cmpi ne, %m, %zero : i64
    %e = arith.extui %ne : i1 to i8
    linalg.yield %e : i8
  } -> tensor<2x8xi8> loc("to_bool")
  %pad = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d1)>, #id2], iterator_types = ["parallel", "parallel"]} ins(%kv : tensor<8xi64>) outs(%be : tensor<2x8xi8>) {
  ^bb0(%k: i64, %o: i8):
    %bi = linalg.index 0 : index
    %lo = arith.constant 0 : i64
    %hi = arith.constant 7 : i64
    %c = arith.minsi %k, %hi : i64
    %c2 = arith.maxsi %c, %lo : i64
    %ki = arith.index_cast %c2 : i64 to index
    %x = tensor.extract %b[%bi, %ki] : tensor<2x8xi8>
    linalg.yield %x : i8
  } -> tensor<2x8xi8> loc("padding")
  return %pad : tensor<2x8xi8>
}
