// RUN: fuse-opt %s --split-input-file --opfuse-fuse-elementwise --opfuse-fuse-reduction | filecheck %s
// RUN: fuse-opt %s --split-input-file --opfuse-fuse-elementwise --opfuse-fuse-reduction --opfuse-remarks 2>&1 >/dev/null | filecheck %s --check-prefix=REMARK
// RUN: fuse-opt %s --split-input-file --opfuse-fuse-elementwise --opfuse-fuse-reduction="fuse-consumers=false" | filecheck %s --check-prefix=NOCONS
// The default pipeline, then the same with this pass switched off: kernels per function.
// RUN: fuse-opt %s --split-input-file --opfuse-report=text | filecheck %s --check-prefix=ON
// RUN: fuse-opt %s --split-input-file --disable-pass=opfuse-fuse-reduction --opfuse-report=text | filecheck %s --check-prefix=OFF
// ON: kernels: 5 -> 1
// ON: kernels: 3 -> 1
// The column reduction's consumer is opfuse-fuse-columns' (later in the pipeline): 1.
// ON: kernels: 3 -> 1
// Without it, x - mean still takes in the small scale of the sum (opfuse-fuse-recompute
// computes it again at every point it is read), but the sum stays a kernel of its own.
// OFF: kernels: 5 -> 4
// OFF-NOT: [fuse-reduction]
// OFF: kernels: 3 -> 2
// (the column sum still takes its consumer, in opfuse-fuse-columns; its producer stays out)
// OFF: kernels: 3 -> 2

#id = affine_map<(d0, d1) -> (d0, d1)>
#rowv = affine_map<(d0, d1) -> (d0)>

// softmax: max, x - max, exp, sum, divide: one row kernel ("input" group).
// CHECK-LABEL: func.func @softmax
// CHECK-COUNT-5: opfuse.group = 0
// CHECK-NOT: opfuse.group = 1
// CHECK: return
// REMARK: remark: [opfuse-fuse-elementwise] not fused: exp -> div: would create a cycle through sum
// REMARK: remark: [opfuse-fuse-reduction] fused: max -> sub: saving
// REMARK: remark: [opfuse-fuse-reduction] fused: exp -> sum: saving
// REMARK: remark: [opfuse-fuse-reduction] fused: sum -> div: saving
// Without consumer fusion, only the producers of each reduction join it: sub and exp
// join sum; max and div stay alone.
// NOCONS-LABEL: func.func @softmax
// NOCONS: linalg.generic {{.*}}opfuse.group = 0
// NOCONS: linalg.exp {opfuse.group = 0
// NOCONS: opfuse.group = 0 : i64, opfuse.kind = "input"
// NOCONS-NOT: opfuse.group
// NOCONS-LABEL: func.func @x_minus_mean
// NOCONS-NOT: opfuse.group
// NOCONS-LABEL: func.func @column
func.func @softmax(%x: tensor<64x256xf32>) -> tensor<64x256xf32> {
  %ninf = arith.constant 0xFF800000 : f32
  %zero = arith.constant 0.0 : f32
  %er = tensor.empty() : tensor<64xf32>
  %fm = linalg.fill ins(%ninf : f32) outs(%er : tensor<64xf32>) -> tensor<64xf32>
  %m = linalg.generic {indexing_maps = [#id, #rowv], iterator_types = ["parallel", "reduction"]}
      ins(%x : tensor<64x256xf32>) outs(%fm : tensor<64xf32>) {
  ^bb0(%i: f32, %acc: f32):
    %r = arith.maximumf %i, %acc : f32
    linalg.yield %r : f32
  } -> tensor<64xf32> loc("max")
  %e = tensor.empty() : tensor<64x256xf32>
  %s = linalg.generic {indexing_maps = [#id, #rowv, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x, %m : tensor<64x256xf32>, tensor<64xf32>) outs(%e : tensor<64x256xf32>) {
  ^bb0(%i: f32, %j: f32, %o: f32):
    %r = arith.subf %i, %j : f32
    linalg.yield %r : f32
  } -> tensor<64x256xf32> loc("sub")
  %ex = linalg.exp ins(%s : tensor<64x256xf32>) outs(%e : tensor<64x256xf32>) -> tensor<64x256xf32> loc("exp")
  %fs = linalg.fill ins(%zero : f32) outs(%er : tensor<64xf32>) -> tensor<64xf32>
  %sum = linalg.generic {indexing_maps = [#id, #rowv], iterator_types = ["parallel", "reduction"]}
      ins(%ex : tensor<64x256xf32>) outs(%fs : tensor<64xf32>) {
  ^bb0(%i: f32, %acc: f32):
    %r = arith.addf %i, %acc : f32
    linalg.yield %r : f32
  } -> tensor<64xf32> loc("sum")
  %d = linalg.generic {indexing_maps = [#id, #rowv, #id], iterator_types = ["parallel", "parallel"]}
      ins(%ex, %sum : tensor<64x256xf32>, tensor<64xf32>) outs(%e : tensor<64x256xf32>) {
  ^bb0(%i: f32, %j: f32, %o: f32):
    %r = arith.divf %i, %j : f32
    linalg.yield %r : f32
  } -> tensor<64x256xf32> loc("div")
  return %d : tensor<64x256xf32>
}

// -----

#id = affine_map<(d0, d1) -> (d0, d1)>
#rowv = affine_map<(d0, d1) -> (d0)>

// x - mean(x): the sum, the scale by 1/n (over the reduced domain) and the subtraction
// (over the row domain) are one kernel.
// CHECK-LABEL: func.func @x_minus_mean
// CHECK-COUNT-3: opfuse.group = 0
// CHECK: return
// The glue op alone saves little (0.01 of the bytes); it is judged together with what
// fusing it enables.
// REMARK: remark: [opfuse-fuse-reduction] fused: rsum -> scale: saving 0.34 > delta 0.10, R_fused 32 < R_limit 128 (together with center)
func.func @x_minus_mean(%x: tensor<64x256xf32>) -> tensor<64x256xf32> {
  %zero = arith.constant 0.0 : f32
  %inv = arith.constant 0.00390625 : f32
  %er = tensor.empty() : tensor<64xf32>
  %fs = linalg.fill ins(%zero : f32) outs(%er : tensor<64xf32>) -> tensor<64xf32>
  %sum = linalg.reduce ins(%x : tensor<64x256xf32>) outs(%fs : tensor<64xf32>) dimensions = [1]
    (%in: f32, %acc: f32) {
      %r = arith.addf %in, %acc : f32
      linalg.yield %r : f32
    } loc("rsum")
  %mean = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>], iterator_types = ["parallel"]}
      ins(%sum : tensor<64xf32>) outs(%er : tensor<64xf32>) {
  ^bb0(%i: f32, %o: f32):
    %r = arith.mulf %i, %inv : f32
    linalg.yield %r : f32
  } -> tensor<64xf32> loc("scale")
  %e = tensor.empty() : tensor<64x256xf32>
  %c = linalg.generic {indexing_maps = [#id, #rowv, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x, %mean : tensor<64x256xf32>, tensor<64xf32>) outs(%e : tensor<64x256xf32>) {
  ^bb0(%i: f32, %j: f32, %o: f32):
    %r = arith.subf %i, %j : f32
    linalg.yield %r : f32
  } -> tensor<64x256xf32> loc("center")
  return %c : tensor<64x256xf32>
}

// -----

#id = affine_map<(d0, d1) -> (d0, d1)>
#rowv = affine_map<(d0, d1) -> (d0)>

// A column reduction takes its producer, but its consumer needs the whole column first
// (a row kernel cannot hold it: opfuse-fuse-columns, test/passes/fuse-columns.mlir).
// CHECK-LABEL: func.func @column
// CHECK: linalg.exp
// CHECK-SAME: opfuse.group = 0
// CHECK: linalg.reduce
// CHECK-SAME: opfuse.group = 0 : i64, opfuse.kind = "input"
// CHECK: linalg.generic
// CHECK-NOT: opfuse.group
// CHECK: return
// REMARK: remark: [opfuse-fuse-reduction] fused: cexp -> csum: saving
// REMARK: remark: [opfuse-fuse-reduction] not fused: csum -> cscale: not a row reduction: its consumers need the whole reduction first
func.func @column(%x: tensor<64x256xf32>) -> tensor<64x256xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<64x256xf32>
  %ex = linalg.exp ins(%x : tensor<64x256xf32>) outs(%e : tensor<64x256xf32>) -> tensor<64x256xf32> loc("cexp")
  %ec = tensor.empty() : tensor<256xf32>
  %fs = linalg.fill ins(%zero : f32) outs(%ec : tensor<256xf32>) -> tensor<256xf32>
  %sum = linalg.reduce ins(%ex : tensor<64x256xf32>) outs(%fs : tensor<256xf32>) dimensions = [0]
    (%in: f32, %acc: f32) {
      %r = arith.addf %in, %acc : f32
      linalg.yield %r : f32
    } loc("csum")
  %d = linalg.generic {indexing_maps = [#id, affine_map<(d0, d1) -> (d1)>, #id], iterator_types = ["parallel", "parallel"]}
      ins(%ex, %sum : tensor<64x256xf32>, tensor<256xf32>) outs(%e : tensor<64x256xf32>) {
  ^bb0(%i: f32, %j: f32, %o: f32):
    %r = arith.divf %i, %j : f32
    linalg.yield %r : f32
  } -> tensor<64x256xf32> loc("cscale")
  return %d : tensor<64x256xf32>
}
