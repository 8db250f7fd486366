// RUN: fuse-opt %s --split-input-file --opfuse-report=text | filecheck %s
// RUN: fuse-opt %s --split-input-file --disable-pass=opfuse-fuse-column-sums --opfuse-report=text | filecheck %s --check-prefix=OFF
// RUN: fuse-opt %s --split-input-file --emit=kernels | filecheck %s --check-prefix=GPU

// opfuse-fuse-column-sums: a column sum over what a row kernel computes joins that row
// kernel, which adds each element into the sum atomically (column_sums.py).

// The input gradient of x - mean(x) over 24 rows of 40 (a row kernel), with the sums over
// the rows of dy (a bias gradient) and of dy * x (a norm weight's): 3 kernels without the
// pass, 1 with it.
// CHECK-LABEL: kernels: 5 -> 1
// CHECK: kernel fusion_0_input: kind=input members=5
// CHECK: fused #{{[0-9]+}} [fuse-column-sums] {{.*}} -> dbias: saving
// CHECK: fused #{{[0-9]+}} [fuse-column-sums] {{.*}} -> dweight: saving
// OFF-LABEL: kernels: 5 -> 3
// OFF: kernel fusion_0_input: kind=input members=3
// OFF: kernel {{.*}}_columns: kind=columns members=1
// OFF: kernel {{.*}}_columns: kind=columns members=1
// The row kernel adds into the sums with atomics (PTX red/atom.add.f32), masked like its stores.
// GPU-LABEL: func.func @fusion_0_input
// GPU: gpu.launch
// GPU: gpu.shuffle xor
// GPU: vector.store
// GPU: memref.atomic_rmw addf
// GPU: memref.atomic_rmw addf
#id = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d0)>
#col = affine_map<(d0, d1) -> (d1)>
func.func @centred_backward(%dy: tensor<24x40xf32>, %x: tensor<24x40xf32>) -> (tensor<24x40xf32>, tensor<40xf32>, tensor<40xf32>) {
  %zero = arith.constant 0.0 : f32
  %n = arith.constant 40.0 : f32
  %er = tensor.empty() : tensor<24xf32>
  %ir = linalg.fill ins(%zero : f32) outs(%er : tensor<24xf32>) -> tensor<24xf32>
  %s = linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]} ins(%dy : tensor<24x40xf32>) outs(%ir : tensor<24xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %r = arith.addf %a, %acc : f32
    linalg.yield %r : f32
  } -> tensor<24xf32> loc("rowsum")
  %e = tensor.empty() : tensor<24x40xf32>
  %dx = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel"]} ins(%dy, %s : tensor<24x40xf32>, tensor<24xf32>) outs(%e : tensor<24x40xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %m = arith.divf %b, %n : f32
    %r = arith.subf %a, %m : f32
    linalg.yield %r : f32
  } -> tensor<24x40xf32> loc("dx")
  %prod = linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]} ins(%dx, %x : tensor<24x40xf32>, tensor<24x40xf32>) outs(%e : tensor<24x40xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %r = arith.mulf %a, %b : f32
    linalg.yield %r : f32
  } -> tensor<24x40xf32> loc("dx_x")
  %ec = tensor.empty() : tensor<40xf32>
  %ic = linalg.fill ins(%zero : f32) outs(%ec : tensor<40xf32>) -> tensor<40xf32>
  %db = linalg.generic {indexing_maps = [#id, #col], iterator_types = ["reduction", "parallel"]} ins(%dx : tensor<24x40xf32>) outs(%ic : tensor<40xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %r = arith.addf %a, %acc : f32
    linalg.yield %r : f32
  } -> tensor<40xf32> loc("dbias")
  %dw = linalg.generic {indexing_maps = [#id, #col], iterator_types = ["reduction", "parallel"]} ins(%prod : tensor<24x40xf32>) outs(%ic : tensor<40xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %r = arith.addf %a, %acc : f32
    linalg.yield %r : f32
  } -> tensor<40xf32> loc("dweight")
  return %dx, %db, %dw : tensor<24x40xf32>, tensor<40xf32>, tensor<40xf32>
}

// -----

// Not taken: a column max (atomics here add f32 only), and a column sum whose accumulator
// starts at an argument (every block would add it).
// CHECK-LABEL: kernels: 4 -> 3
// CHECK: not fused [fuse-column-sums] {{.*}} -> colmax: a column reduction that is not a sum
// CHECK: not fused [fuse-column-sums] {{.*}} -> colacc: a sum whose accumulator does not start at zero
#id = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d0)>
#col = affine_map<(d0, d1) -> (d1)>
func.func @refused(%dy: tensor<24x40xf32>, %acc0: tensor<40xf32>) -> (tensor<24x40xf32>, tensor<40xf32>, tensor<40xf32>) {
  %zero = arith.constant 0.0 : f32
  %ninf = arith.constant 0xFF800000 : f32
  %er = tensor.empty() : tensor<24xf32>
  %ir = linalg.fill ins(%zero : f32) outs(%er : tensor<24xf32>) -> tensor<24xf32>
  %s = linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]} ins(%dy : tensor<24x40xf32>) outs(%ir : tensor<24xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %r = arith.addf %a, %acc : f32
    linalg.yield %r : f32
  } -> tensor<24xf32> loc("rowsum")
  %e = tensor.empty() : tensor<24x40xf32>
  %dx = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel"]} ins(%dy, %s : tensor<24x40xf32>, tensor<24xf32>) outs(%e : tensor<24x40xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %r = arith.subf %a, %b : f32
    linalg.yield %r : f32
  } -> tensor<24x40xf32> loc("dx")
  %ec = tensor.empty() : tensor<40xf32>
  %im = linalg.fill ins(%ninf : f32) outs(%ec : tensor<40xf32>) -> tensor<40xf32>
  %mx = linalg.generic {indexing_maps = [#id, #col], iterator_types = ["reduction", "parallel"]} ins(%dx : tensor<24x40xf32>) outs(%im : tensor<40xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %r = arith.maximumf %a, %acc : f32
    linalg.yield %r : f32
  } -> tensor<40xf32> loc("colmax")
  %ca = linalg.generic {indexing_maps = [#id, #col], iterator_types = ["reduction", "parallel"]} ins(%dx : tensor<24x40xf32>) outs(%acc0 : tensor<40xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %r = arith.addf %a, %acc : f32
    linalg.yield %r : f32
  } -> tensor<40xf32> loc("colacc")
  return %dx, %mx, %ca : tensor<24x40xf32>, tensor<40xf32>, tensor<40xf32>
}

// -----

// A matmul's result summed over its rows: dy = g @ w (the gradient reaching a linear
// layer) and that layer's bias gradient dy.sum(0), through a view that splits the rows
// (2x12 of 24, as a [B, S, N] activation is): one kernel, the matmul adding each element
// of its tiles into the sum.
// CHECK-LABEL: kernels: 3 -> 1
// CHECK: kernel fusion_0_output: kind=output members=3
// CHECK: fused #{{[0-9]+}} [fuse-column-sums] dy -> view: saving
// GPU-LABEL: func.func @fusion_0_output
// GPU: gpu.launch
// GPU: memref.atomic_rmw addf
#id3 = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#col3 = affine_map<(d0, d1, d2) -> (d2)>
func.func @linear_bias_gradient(%g: tensor<24x32xf32>, %w: tensor<32x40xf32>) -> (tensor<24x40xf32>, tensor<40xf32>) {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<24x40xf32>
  %z = linalg.fill ins(%zero : f32) outs(%e : tensor<24x40xf32>) -> tensor<24x40xf32>
  %dy = linalg.matmul ins(%g, %w : tensor<24x32xf32>, tensor<32x40xf32>) outs(%z : tensor<24x40xf32>) -> tensor<24x40xf32> loc("dy")
  %v = tensor.expand_shape %dy [[0, 1], [2]] output_shape [2, 12, 40] : tensor<24x40xf32> into tensor<2x12x40xf32> loc("view")
  %ec = tensor.empty() : tensor<40xf32>
  %ic = linalg.fill ins(%zero : f32) outs(%ec : tensor<40xf32>) -> tensor<40xf32>
  %db = linalg.generic {indexing_maps = [#id3, #col3], iterator_types = ["reduction", "reduction", "parallel"]} ins(%v : tensor<2x12x40xf32>) outs(%ic : tensor<40xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %r = arith.addf %a, %acc : f32
    linalg.yield %r : f32
  } -> tensor<40xf32> loc("dbias")
  return %dy, %db : tensor<24x40xf32>, tensor<40xf32>
}

// -----

// The embeddings' backward (GPT-2's first LayerNorm backward, here x - mean(x) over 2 x 8
// tokens of 32): its result summed into the token rows by their ids (a scatter-add: the
// token embedding's gradient) and over the batch (the position embedding's). Both join the
// row kernel: each thread adds the elements of its row, the scatter at the row its token id
// picks (when 0 <= id < 50), the batch sum at its position.
// CHECK-LABEL: kernels: 5 -> 1
// CHECK: kernel fusion_0_input: kind=input members=5
// CHECK: fused #{{[0-9]+}} [fuse-column-sums] sub -> dwte: saving
// CHECK: fused #{{[0-9]+}} [fuse-column-sums] {{.*}} -> dwpe: saving
// OFF-LABEL: kernels: 5 -> 3
// OFF: kernel fusion_0_input: kind=input members=3
// OFF: kernel {{.*}}_scatter: kind=scatter members=1
// OFF: kernel {{.*}}_columns: kind=columns members=1
// GPU-LABEL: func.func @fusion_0_input
// GPU: gpu.shuffle xor
// GPU: arith.cmpi slt, %{{.*}}, %c50_i64 : i64
// GPU: scf.if
// GPU: memref.atomic_rmw addf %{{.*}} : (f32, memref<1600xf32>) -> f32
// GPU: memref.atomic_rmw addf %{{.*}} : (f32, memref<256xf32>) -> f32
  func.func @embeddings_backward(%dy: tensor<2x8x32xf32> loc("dy"), %ids: tensor<2x8xi64> loc("ids")) -> (tensor<50x32xf32>, tensor<8x32xf32>) {
    %0 = tensor.empty() : tensor<2x8xf32> loc("mean.sum")
    %1 = arith.constant 0.0 : f32 loc("mean.sum")
    %2 = linalg.fill ins(%1 : f32) outs(%0 : tensor<2x8xf32>) -> tensor<2x8xf32> loc("mean.sum")
    %3 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1, d2)>, affine_map<(d0, d1, d2) -> (d0, d1)>], iterator_types = ["parallel", "parallel", "reduction"]} ins(%dy : tensor<2x8x32xf32>) outs(%2 : tensor<2x8xf32>) {
    ^bb0(%4: f32, %5: f32):
      %6 = arith.addf %4, %5 : f32
      linalg.yield %6 : f32
    } -> tensor<2x8xf32> loc("mean.sum")
    %7 = tensor.empty() : tensor<2x8xf32> loc("mean.mul")
    %8 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%3 : tensor<2x8xf32>) outs(%7 : tensor<2x8xf32>) {
    ^bb0(%9: f32, %10: f32):
      %11 = arith.constant 0.03125 : f32
      %12 = arith.mulf %9, %11 : f32
      linalg.yield %12 : f32
    } -> tensor<2x8xf32> loc("mean.mul")
    %13 = tensor.empty() : tensor<2x8x32xf32> loc("sub")
    %14 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1, d2)>, affine_map<(d0, d1, d2) -> (d0, d1)>, affine_map<(d0, d1, d2) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel"]} ins(%dy, %8 : tensor<2x8x32xf32>, tensor<2x8xf32>) outs(%13 : tensor<2x8x32xf32>) {
    ^bb0(%15: f32, %16: f32, %17: f32):
      %18 = arith.subf %15, %16 : f32
      linalg.yield %18 : f32
    } -> tensor<2x8x32xf32> loc("sub")
    %19 = tensor.empty() : tensor<50x32xf32> loc("dwte")
    %20 = arith.constant 0.0 : f32 loc("dwte")
    %21 = linalg.fill ins(%20 : f32) outs(%19 : tensor<50x32xf32>) -> tensor<50x32xf32> loc("dwte")
    %22 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d2, d3, d1)>, affine_map<(d0, d1, d2, d3) -> (d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1)>], iterator_types = ["parallel", "parallel", "reduction", "reduction"]} ins(%14, %ids : tensor<2x8x32xf32>, tensor<2x8xi64>) outs(%21 : tensor<50x32xf32>) {
    ^bb0(%23: f32, %24: i64, %25: f32):
      %26 = linalg.index 0 : index
      %27 = arith.index_cast %26 : index to i64
      %28 = arith.cmpi eq, %24, %27 : i64
      %29 = arith.constant 0.0 : f32
      %30 = arith.select %28, %23, %29 : f32
      %31 = arith.addf %25, %30 : f32
      linalg.yield %31 : f32
    } -> tensor<50x32xf32> loc("dwte")
    %32 = tensor.empty() : tensor<8x32xf32> loc("dwpe")
    %33 = arith.constant 0.0 : f32 loc("dwpe")
    %34 = linalg.fill ins(%33 : f32) outs(%32 : tensor<8x32xf32>) -> tensor<8x32xf32> loc("dwpe")
    %35 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1, d2)>, affine_map<(d0, d1, d2) -> (d1, d2)>], iterator_types = ["reduction", "parallel", "parallel"]} ins(%14 : tensor<2x8x32xf32>) outs(%34 : tensor<8x32xf32>) {
    ^bb0(%36: f32, %37: f32):
      %38 = arith.addf %36, %37 : f32
      linalg.yield %38 : f32
    } -> tensor<8x32xf32> loc("dwpe")
    return %22, %35 : tensor<50x32xf32>, tensor<8x32xf32>
  } loc("embeddings_backward")

