// RUN: fuse-opt %s --split-input-file --opfuse-fuse-elementwise --opfuse-fuse-epilogue | filecheck %s
// RUN: fuse-opt %s --split-input-file --opfuse-fuse-elementwise --opfuse-fuse-epilogue --opfuse-remarks 2>&1 >/dev/null | filecheck %s --check-prefix=REMARK
// RUN: fuse-opt %s --split-input-file --opfuse-remarks 2>&1 >/dev/null | filecheck %s --check-prefix=DEFAULT
// RUN: fuse-opt %s --split-input-file --opfuse-fuse-elementwise --opfuse-fuse-epilogue="r-limit=32" --opfuse-remarks 2>&1 >/dev/null | filecheck %s --check-prefix=GUARD

#id = affine_map<(d0, d1) -> (d0, d1)>
#col = affine_map<(d0, d1) -> (d1)>

// Linear + bias + ReLU: the bias add and the ReLU (one loop group after elementwise
// fusion) become the matmul's epilogue: one "output" group.
// CHECK-LABEL: func.func @linear_relu
// CHECK: linalg.matmul {{.*}}opfuse.group = 0 : i64, opfuse.kind = "output"
// CHECK: opfuse.group = 0
// CHECK: opfuse.group = 0
// CHECK-NOT: opfuse.group = 1
// CHECK: return
// REMARK: remark: [opfuse-fuse-epilogue] fused: mm -> bias: saving {{.*}} > delta 0.10, R_fused {{.*}} < R_limit 128
// The guard still decides: with 64 registers the fused kernel does not fit.
// GUARD: remark: [opfuse-fuse-epilogue] not fused: mm -> bias: R_fused {{.*}} >= R_limit 32
func.func @linear_relu(%x: tensor<64x32xf32>, %w: tensor<32x48xf32>, %b: tensor<48xf32>) -> tensor<64x48xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<64x48xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<64x48xf32>) -> tensor<64x48xf32>
  %mm = linalg.matmul ins(%x, %w : tensor<64x32xf32>, tensor<32x48xf32>) outs(%f : tensor<64x48xf32>) -> tensor<64x48xf32> loc("mm")
  %y = linalg.generic {indexing_maps = [#id, #col, #id], iterator_types = ["parallel", "parallel"]}
      ins(%mm, %b : tensor<64x48xf32>, tensor<48xf32>) outs(%e : tensor<64x48xf32>) {
  ^bb0(%i: f32, %j: f32, %o: f32):
    %r = arith.addf %i, %j : f32
    linalg.yield %r : f32
  } -> tensor<64x48xf32> loc("bias")
  %z = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%y : tensor<64x48xf32>) outs(%e : tensor<64x48xf32>) {
  ^bb0(%i: f32, %o: f32):
    %r = arith.maximumf %i, %zero : f32
    linalg.yield %r : f32
  } -> tensor<64x48xf32> loc("relu")
  return %z : tensor<64x48xf32>
}

// -----

#id = affine_map<(d0, d1) -> (d0, d1)>
#t = affine_map<(d0, d1) -> (d1, d0)>

// A consumer that reads the matmul result transposed needs values other threads hold:
// not an epilogue.
// CHECK-LABEL: func.func @transposed_read
// CHECK-NOT: opfuse.kind = "output"
// CHECK: return
// REMARK: remark: [opfuse-fuse-epilogue] not fused: mm -> addt: addt reads the matmul result at another index
func.func @transposed_read(%x: tensor<32x32xf32>, %w: tensor<32x32xf32>) -> tensor<32x32xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<32x32xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<32x32xf32>) -> tensor<32x32xf32>
  %mm = linalg.matmul ins(%x, %w : tensor<32x32xf32>, tensor<32x32xf32>) outs(%f : tensor<32x32xf32>) -> tensor<32x32xf32> loc("mm")
  %y = linalg.generic {indexing_maps = [#t, #id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%mm, %x : tensor<32x32xf32>, tensor<32x32xf32>) outs(%e : tensor<32x32xf32>) {
  ^bb0(%i: f32, %j: f32, %o: f32):
    %r = arith.addf %i, %j : f32
    linalg.yield %r : f32
  } -> tensor<32x32xf32> loc("addt")
  return %y : tensor<32x32xf32>
}

// -----

#id = affine_map<(d0, d1) -> (d0, d1)>

// SwiGLU: silu(x @ wg) * (x @ wu). The gating multiply joins the first matmul (it reads
// the second matmul's result from memory, pointwise); the second matmul cannot join a
// kernel that already holds one.
// CHECK-LABEL: func.func @swiglu
// CHECK: linalg.matmul {opfuse.group = 0 : i64, opfuse.kind = "output"} ins(%arg0, %arg1
// CHECK-NEXT: %[[U:.*]] = linalg.matmul ins(%arg0, %arg2 : {{.*}}) -> tensor<16x64xf32>{{$}}
// CHECK: opfuse.group = 0
// CHECK: ins(%{{.*}}, %[[U]] : {{.*}}opfuse.group = 0
// REMARK: remark: [opfuse-fuse-epilogue] fused: gate -> sig: saving
// REMARK: remark: [opfuse-fuse-epilogue] not fused: up -> gated: the consumer already holds a matmul
func.func @swiglu(%x: tensor<16x32xf32>, %wg: tensor<32x64xf32>, %wu: tensor<32x64xf32>) -> tensor<16x64xf32> {
  %zero = arith.constant 0.0 : f32
  %one = arith.constant 1.0 : f32
  %e = tensor.empty() : tensor<16x64xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<16x64xf32>) -> tensor<16x64xf32>
  %g = linalg.matmul ins(%x, %wg : tensor<16x32xf32>, tensor<32x64xf32>) outs(%f : tensor<16x64xf32>) -> tensor<16x64xf32> loc("gate")
  %u = linalg.matmul ins(%x, %wu : tensor<16x32xf32>, tensor<32x64xf32>) outs(%f : tensor<16x64xf32>) -> tensor<16x64xf32> loc("up")
  %s = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%g : tensor<16x64xf32>) outs(%e : tensor<16x64xf32>) {
  ^bb0(%i: f32, %o: f32):
    %n = arith.negf %i : f32
    %ex = math.exp %n : f32
    %d = arith.addf %ex, %one : f32
    %r = arith.divf %i, %d : f32
    linalg.yield %r : f32
  } -> tensor<16x64xf32> loc("sig")
  %y = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%s, %u : tensor<16x64xf32>, tensor<16x64xf32>) outs(%e : tensor<16x64xf32>) {
  ^bb0(%i: f32, %j: f32, %o: f32):
    %r = arith.mulf %i, %j : f32
    linalg.yield %r : f32
  } -> tensor<16x64xf32> loc("gated")
  return %y : tensor<16x64xf32>
}

// -----

#id = affine_map<(d0, d1) -> (d0, d1)>
#col = affine_map<(d0, d1) -> (d1)>

// A reshape at the end of the epilogue is a free view of the output: it joins too.
// CHECK-LABEL: func.func @bias_then_reshape
// CHECK: linalg.matmul {{.*}}opfuse.group = 0 : i64, opfuse.kind = "output"
// CHECK: opfuse.group = 0
// CHECK: tensor.expand_shape {{.*}}opfuse.group = 0
// REMARK: remark: [opfuse-fuse-epilogue] fused: mm -> bias: saving
func.func @bias_then_reshape(%x: tensor<64x32xf32>, %w: tensor<32x48xf32>, %b: tensor<48xf32>) -> tensor<4x16x48xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<64x48xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<64x48xf32>) -> tensor<64x48xf32>
  %mm = linalg.matmul ins(%x, %w : tensor<64x32xf32>, tensor<32x48xf32>) outs(%f : tensor<64x48xf32>) -> tensor<64x48xf32> loc("mm")
  %y = linalg.generic {indexing_maps = [#id, #col, #id], iterator_types = ["parallel", "parallel"]}
      ins(%mm, %b : tensor<64x48xf32>, tensor<48xf32>) outs(%e : tensor<64x48xf32>) {
  ^bb0(%i: f32, %j: f32, %o: f32):
    %r = arith.addf %i, %j : f32
    linalg.yield %r : f32
  } -> tensor<64x48xf32> loc("bias")
  %r = tensor.expand_shape %y [[0, 1], [2]] output_shape [4, 16, 48] : tensor<64x48xf32> into tensor<4x16x48xf32> loc("unflatten")
  return %r : tensor<4x16x48xf32>
}

// -----

#id3 = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#ch3 = affine_map<(d0, d1, d2) -> (d2)>

// torch's nn.Linear on a [B, S, D] input: the matmul runs on [B*S, D] and its result is
// expanded back to [B, S, N] ("unflat") before the bias add and the residual. The reshape
// only splits M, so the result keeps the matmul's layout: bias and residual join it.
// CHECK-LABEL: func.func @linear_unflat_bias_residual
// CHECK: linalg.matmul {{.*}}opfuse.group = 0 : i64, opfuse.kind = "output"
// CHECK: tensor.expand_shape {{.*}}opfuse.group = 0
// CHECK: opfuse.group = 0
// CHECK-NOT: opfuse.group = 1
// CHECK: return
// REMARK: remark: [opfuse-fuse-epilogue] fused: linear.mm -> linear.unflat: saving
// REMARK: remark: [opfuse-fuse-epilogue] fused: linear.unflat -> linear: saving
// The default pipeline puts the reshape in the consumer's group first (a reshape inside
// the epilogue, not at its end): the same kernel.
// DEFAULT: remark: [opfuse-fuse-producer-consumer] fused: linear.unflat -> linear
// DEFAULT: remark: [opfuse-fuse-epilogue] fused: linear.mm -> linear.unflat: saving
func.func @linear_unflat_bias_residual(%x: tensor<18x32xf32>, %w: tensor<32x48xf32>, %b: tensor<48xf32>, %res: tensor<2x9x48xf32>) -> tensor<2x9x48xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<18x48xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<18x48xf32>) -> tensor<18x48xf32>
  %mm = linalg.matmul ins(%x, %w : tensor<18x32xf32>, tensor<32x48xf32>) outs(%f : tensor<18x48xf32>) -> tensor<18x48xf32> loc("linear.mm")
  %u = tensor.expand_shape %mm [[0, 1], [2]] output_shape [2, 9, 48] : tensor<18x48xf32> into tensor<2x9x48xf32> loc("linear.unflat")
  %e3 = tensor.empty() : tensor<2x9x48xf32>
  %y = linalg.generic {indexing_maps = [#id3, #ch3, #id3, #id3], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%u, %b, %res : tensor<2x9x48xf32>, tensor<48xf32>, tensor<2x9x48xf32>) outs(%e3 : tensor<2x9x48xf32>) {
  ^bb0(%i: f32, %j: f32, %k: f32, %o: f32):
    %s = arith.addf %i, %j : f32
    %t = arith.addf %s, %k : f32
    linalg.yield %t : f32
  } -> tensor<2x9x48xf32> loc("linear")
  return %y : tensor<2x9x48xf32>
}

// -----

#id1 = affine_map<(d0) -> (d0)>

// A reshape that merges the matmul's M and N dims into one (the flat [M*N] vector) is no
// view of its 2-D tiles: it may end the kernel (a free view of its output), but the add
// that iterates over it stays apart, with the reason.
// CHECK-LABEL: func.func @flatten_m_and_n
// CHECK: tensor.collapse_shape {{.*}}opfuse.group = 0
// CHECK: linalg.generic
// CHECK-NOT: opfuse.group = 0
// CHECK: return
// REMARK: remark: [opfuse-fuse-epilogue] not fused: flat -> add: flat merges the matmul's M and N dims (16x8 into 128): not a reshape of one of them, so not a view of its tiles
// DEFAULT: remark: [opfuse-fuse-epilogue] not fused: mm -> flat: flat merges the matmul's M and N dims (16x8 into 128): not a reshape of one of them, so not a view of its tiles
func.func @flatten_m_and_n(%x: tensor<16x32xf32>, %w: tensor<32x8xf32>, %b: tensor<128xf32>) -> tensor<128xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<16x8xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<16x8xf32>) -> tensor<16x8xf32>
  %mm = linalg.matmul ins(%x, %w : tensor<16x32xf32>, tensor<32x8xf32>) outs(%f : tensor<16x8xf32>) -> tensor<16x8xf32> loc("mm")
  %flat = tensor.collapse_shape %mm [[0, 1]] : tensor<16x8xf32> into tensor<128xf32> loc("flat")
  %e1 = tensor.empty() : tensor<128xf32>
  %y = linalg.generic {indexing_maps = [#id1, #id1, #id1], iterator_types = ["parallel"]}
      ins(%flat, %b : tensor<128xf32>, tensor<128xf32>) outs(%e1 : tensor<128xf32>) {
  ^bb0(%i: f32, %j: f32, %o: f32):
    %s = arith.addf %i, %j : f32
    linalg.yield %s : f32
  } -> tensor<128xf32> loc("add")
  return %y : tensor<128xf32>
}

// -----

// A transpose of the matmul's result on the way to the epilogue (a tied embedding's
// gradient, dWᵀ + the scatter's): each element is one accumulator, stored at the
// permuted index, so the transpose and the add join the matmul.
// CHECK-LABEL: func.func @tied_gradient
// CHECK: linalg.matmul {{.*}}opfuse.group = [[G:[0-9]+]]
// CHECK: linalg.transpose {{.*}}opfuse.group = [[G]]
// CHECK: linalg.generic {{.*}}attrs = {opfuse.group = [[G]] : i64}
// REMARK: remark: [opfuse-fuse-epilogue] fused: matmul -> transpose: saving
// REMARK: remark: [opfuse-fuse-epilogue] fused: transpose -> add: saving
  func.func @tied_gradient(%x: tensor<40x24xf32> loc("x"), %w: tensor<24x36xf32> loc("w"), %t: tensor<36x40xf32> loc("t")) -> (tensor<36x40xf32>) {
    %0 = tensor.empty() : tensor<40x36xf32> loc("matmul")
    %1 = arith.constant 0.0 : f32 loc("matmul")
    %2 = linalg.fill ins(%1 : f32) outs(%0 : tensor<40x36xf32>) -> tensor<40x36xf32> loc("matmul")
    %3 = linalg.matmul ins(%x, %w : tensor<40x24xf32>, tensor<24x36xf32>) outs(%2 : tensor<40x36xf32>) -> tensor<40x36xf32> loc("matmul")
    %4 = tensor.empty() : tensor<36x40xf32> loc("transpose")
    %5 = linalg.transpose ins(%3 : tensor<40x36xf32>) outs(%4 : tensor<36x40xf32>) permutation = [1, 0] loc("transpose")
    %6 = tensor.empty() : tensor<36x40xf32> loc("add")
    %7 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%5, %t : tensor<36x40xf32>, tensor<36x40xf32>) outs(%6 : tensor<36x40xf32>) {
    ^bb0(%8: f32, %9: f32, %10: f32):
      %11 = arith.addf %8, %9 : f32
      linalg.yield %11 : f32
    } -> tensor<36x40xf32> loc("add")
    return %7 : tensor<36x40xf32>
  } loc("tied_gradient")

