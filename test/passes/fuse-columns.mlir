// RUN: fuse-opt %s --split-input-file --opfuse-report=text | filecheck %s
// RUN: fuse-opt %s --split-input-file --disable-pass=opfuse-fuse-columns --opfuse-report=text | filecheck %s --check-prefix=OFF
// RUN: fuse-opt %s --split-input-file --emit=kernels | filecheck %s --check-prefix=GPU

// opfuse-fuse-columns: a reduction over a non-innermost axis (a column reduction) takes its
// consumers and the small producers it reads through a broadcast, as one `columns` kernel
// (one thread per kept point walks its column: backends/gpu/emit/columns.py).

// The zoo's embedding classifier as the torch importer writes it (masked mean pooling,
// then Linear): sum_1 sums the masked embeddings over the sequence (2x8x32 -> 2x32), the
// mask count sum_2 -> clamp is one value per batch row that div reads at every hidden
// unit. One columns kernel and the matmul with its bias: 2 kernels (Inductor: 2). Without
// the pass: the count, the pooled sum, the division and the matmul (4).
// CHECK-LABEL: kernels: 11 -> 2
// CHECK: kernel fusion_0_columns: kind=columns members=7
// CHECK: kernel fusion_1_output: kind=output members=3
// CHECK: fused #{{[0-9]+}} [fuse-columns] sum_1 -> div: saving 0.17 > delta 0.10
// The count is computed again by each thread (its 8 mask values), judged in time.
// CHECK: fused #{{[0-9]+}} [fuse-columns] clamp -> mul: time saving 0.50 > delta 0.10 (W +{{[0-9]+}} flops, Q -144 B)
// The bias: under delta in bytes (the weight is most of Q), but a launch saved.
// CHECK: fused #{{[0-9]+}} [fuse-epilogue] linear.mm -> linear: saving 0.08 <= delta 0.10 in bytes, time saving 0.50 > delta with 1 launch saved
// OFF-LABEL: kernels: 11 -> 4
// OFF: not fused [fuse-reduction] sum_1 -> div: not a row reduction: its consumers need the whole reduction first
// GPU-LABEL: func.func @fusion_0_columns
// GPU: gpu.launch
// GPU: scf.for
// GPU: memref.load
// GPU: scf.yield
// GPU: arith.divf
// GPU: memref.store

module {
  func.func @embedding_classifier(%args_0: tensor<2x8xi64> loc("args_0"), %args_1: tensor<128x32xf32> loc("args_1"), %args_2: tensor<2x8xi64> loc("args_2"), %args_3: tensor<5x32xf32> loc("args_3"), %args_4: tensor<5xf32> loc("args_4")) -> (tensor<2x5xf32>) {
    %0 = tensor.expand_shape %args_0 [[0], [1, 2]] output_shape [2, 8, 1] : tensor<2x8xi64> into tensor<2x8x1xi64> loc("unsqueeze")
    %1 = tensor.empty() : tensor<2x8x1xf32> loc("_to_copy")
    %2 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1, d2)>, affine_map<(d0, d1, d2) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel"]} ins(%0 : tensor<2x8x1xi64>) outs(%1 : tensor<2x8x1xf32>) {
    ^bb0(%3: i64, %4: f32):
      %5 = arith.sitofp %3 : i64 to f32
      linalg.yield %5 : f32
    } -> tensor<2x8x1xf32> loc("_to_copy")
    %6 = tensor.empty() : tensor<2x8x32xf32> loc("embedding")
    %7 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1)>, affine_map<(d0, d1, d2) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel"]} ins(%args_2 : tensor<2x8xi64>) outs(%6 : tensor<2x8x32xf32>) {
    ^bb0(%8: i64, %9: f32):
      %10 = arith.constant 0 : i64
      %11 = arith.constant 128 : i64
      %12 = arith.constant 127 : i64
      %13 = arith.cmpi slt, %8, %10 : i64
      %14 = arith.addi %8, %11 : i64
      %15 = arith.select %13, %14, %8 : i64
      %16 = arith.maxsi %15, %10 : i64
      %17 = arith.minsi %16, %12 : i64
      %18 = arith.index_cast %17 : i64 to index
      %19 = linalg.index 2 : index
      %20 = tensor.extract %args_1[%18, %19] : tensor<128x32xf32>
      linalg.yield %20 : f32
    } -> tensor<2x8x32xf32> loc("embedding")
    %21 = tensor.empty() : tensor<2x8x32xf32> loc("mul")
    %22 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1, d2)>, affine_map<(d0, d1, d2) -> (d0, d1, 0)>, affine_map<(d0, d1, d2) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel"]} ins(%7, %2 : tensor<2x8x32xf32>, tensor<2x8x1xf32>) outs(%21 : tensor<2x8x32xf32>) {
    ^bb0(%23: f32, %24: f32, %25: f32):
      %26 = arith.mulf %23, %24 : f32
      linalg.yield %26 : f32
    } -> tensor<2x8x32xf32> loc("mul")
    %27 = tensor.empty() : tensor<2x32xf32> loc("sum_1")
    %28 = arith.constant 0.0 : f32 loc("sum_1")
    %29 = linalg.fill ins(%28 : f32) outs(%27 : tensor<2x32xf32>) -> tensor<2x32xf32> loc("sum_1")
    %30 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1, d2)>, affine_map<(d0, d1, d2) -> (d0, d2)>], iterator_types = ["parallel", "reduction", "parallel"]} ins(%22 : tensor<2x8x32xf32>) outs(%29 : tensor<2x32xf32>) {
    ^bb0(%31: f32, %32: f32):
      %33 = arith.addf %31, %32 : f32
      linalg.yield %33 : f32
    } -> tensor<2x32xf32> loc("sum_1")
    %34 = tensor.empty() : tensor<2x1xf32> loc("sum_2")
    %35 = arith.constant 0.0 : f32 loc("sum_2")
    %36 = linalg.fill ins(%35 : f32) outs(%34 : tensor<2x1xf32>) -> tensor<2x1xf32> loc("sum_2")
    %37 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1, d2)>, affine_map<(d0, d1, d2) -> (d0, d2)>], iterator_types = ["parallel", "reduction", "parallel"]} ins(%2 : tensor<2x8x1xf32>) outs(%36 : tensor<2x1xf32>) {
    ^bb0(%38: f32, %39: f32):
      %40 = arith.addf %38, %39 : f32
      linalg.yield %40 : f32
    } -> tensor<2x1xf32> loc("sum_2")
    %41 = tensor.empty() : tensor<2x1xf32> loc("clamp")
    %42 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%37 : tensor<2x1xf32>) outs(%41 : tensor<2x1xf32>) {
    ^bb0(%43: f32, %44: f32):
      %45 = arith.constant 1.0 : f32
      %46 = arith.maximumf %43, %45 : f32
      linalg.yield %46 : f32
    } -> tensor<2x1xf32> loc("clamp")
    %47 = tensor.empty() : tensor<2x32xf32> loc("div")
    %48 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, 0)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%30, %42 : tensor<2x32xf32>, tensor<2x1xf32>) outs(%47 : tensor<2x32xf32>) {
    ^bb0(%49: f32, %50: f32, %51: f32):
      %52 = arith.divf %49, %50 : f32
      linalg.yield %52 : f32
    } -> tensor<2x32xf32> loc("div")
    %53 = tensor.empty() : tensor<32x5xf32> loc("linear.wt")
    %54 = linalg.transpose ins(%args_3 : tensor<5x32xf32>) outs(%53 : tensor<32x5xf32>) permutation = [1, 0] loc("linear.wt")
    %55 = tensor.empty() : tensor<2x5xf32> loc("linear.mm")
    %56 = arith.constant 0.0 : f32 loc("linear.mm")
    %57 = linalg.fill ins(%56 : f32) outs(%55 : tensor<2x5xf32>) -> tensor<2x5xf32> loc("linear.mm")
    %58 = linalg.matmul ins(%48, %54 : tensor<2x32xf32>, tensor<32x5xf32>) outs(%57 : tensor<2x5xf32>) -> tensor<2x5xf32> loc("linear.mm")
    %59 = tensor.empty() : tensor<2x5xf32> loc("linear")
    %60 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%58, %args_4 : tensor<2x5xf32>, tensor<5xf32>) outs(%59 : tensor<2x5xf32>) {
    ^bb0(%61: f32, %62: f32, %63: f32):
      %64 = arith.addf %61, %62 : f32
      linalg.yield %64 : f32
    } -> tensor<2x5xf32> loc("linear")
    return %60 : tensor<2x5xf32>
  } loc("embedding_classifier")
}

// -----

// torch's weight_norm(dim=2): the norm over the filter's two leading axes, then v / norm
// over the whole filter: the thread walks its column twice (the sum, then the result).
// CHECK-LABEL: kernels: 5 -> 1
// CHECK: kernel fusion_0_columns: kind=columns members=6
// CHECK: fused #{{[0-9]+}} [fuse-columns] sum -> norm: saving 0.07 <= delta 0.10 in bytes, time saving 0.50 > delta with 1 launch saved
// CHECK: fused #{{[0-9]+}} [fuse-columns] norm -> div: saving 0.35 > delta 0.10
// OFF-LABEL: kernels: 5 -> 2
// GPU-LABEL: func.func @fusion_0_columns
// GPU: scf.for
// GPU: arith.addf
// GPU: scf.yield
// GPU: scf.for
// GPU: math.sqrt
// GPU: arith.divf
// GPU: memref.store
module {
  func.func @weight_norm(%v: tensor<6x4x12xf32> loc("v"), %g: tensor<1x1x12xf32> loc("g")) -> (tensor<6x4x12xf32>) {
    %0 = tensor.empty() : tensor<6x4x12xf32> loc("sq")
    %1 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1, d2)>, affine_map<(d0, d1, d2) -> (d0, d1, d2)>, affine_map<(d0, d1, d2) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel"]} ins(%v, %v : tensor<6x4x12xf32>, tensor<6x4x12xf32>) outs(%0 : tensor<6x4x12xf32>) {
    ^bb0(%2: f32, %3: f32, %4: f32):
      %5 = arith.mulf %2, %3 : f32
      linalg.yield %5 : f32
    } -> tensor<6x4x12xf32> loc("sq")
    %6 = tensor.empty() : tensor<12xf32> loc("sum")
    %7 = arith.constant 0.0 : f32 loc("sum")
    %8 = linalg.fill ins(%7 : f32) outs(%6 : tensor<12xf32>) -> tensor<12xf32> loc("sum")
    %9 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1, d2)>, affine_map<(d0, d1, d2) -> (d2)>], iterator_types = ["reduction", "reduction", "parallel"]} ins(%1 : tensor<6x4x12xf32>) outs(%8 : tensor<12xf32>) {
    ^bb0(%10: f32, %11: f32):
      %12 = arith.addf %10, %11 : f32
      linalg.yield %12 : f32
    } -> tensor<12xf32> loc("sum")
    %13 = tensor.empty() : tensor<12xf32> loc("norm")
    %14 = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>], iterator_types = ["parallel"]} ins(%9 : tensor<12xf32>) outs(%13 : tensor<12xf32>) {
    ^bb0(%15: f32, %16: f32):
      %17 = math.sqrt %15 : f32
      linalg.yield %17 : f32
    } -> tensor<12xf32> loc("norm")
    %18 = tensor.empty() : tensor<6x4x12xf32> loc("div")
    %19 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1, d2)>, affine_map<(d0, d1, d2) -> (d2)>, affine_map<(d0, d1, d2) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel"]} ins(%v, %14 : tensor<6x4x12xf32>, tensor<12xf32>) outs(%18 : tensor<6x4x12xf32>) {
    ^bb0(%20: f32, %21: f32, %22: f32):
      %23 = arith.divf %20, %21 : f32
      linalg.yield %23 : f32
    } -> tensor<6x4x12xf32> loc("div")
    %24 = tensor.empty() : tensor<6x4x12xf32> loc("scale")
    %25 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1, d2)>, affine_map<(d0, d1, d2) -> (0, 0, d2)>, affine_map<(d0, d1, d2) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel"]} ins(%19, %g : tensor<6x4x12xf32>, tensor<1x1x12xf32>) outs(%24 : tensor<6x4x12xf32>) {
    ^bb0(%26: f32, %27: f32, %28: f32):
      %29 = arith.mulf %26, %27 : f32
      linalg.yield %29 : f32
    } -> tensor<6x4x12xf32> loc("scale")
    return %25 : tensor<6x4x12xf32>
  } loc("weight_norm")
}

// -----

// The mask cast is also returned: the count group is not recomputed (it stays a kernel,
// and so would its result's round trip); the division still joins the columns.
// CHECK-LABEL: kernels: 6 -> 2
// CHECK: kernel fusion_0_input: kind=input members=3
// CHECK: kernel fusion_1_columns: kind=columns members=3
// CHECK: fused #{{[0-9]+}} [fuse-columns] total -> mean: saving 0.17 > delta 0.10
// CHECK: not fused [fuse-columns] clamp -> masked: m is also read outside the column kernel
module {
  func.func @count_returned(%mask: tensor<2x8xi64> loc("mask"), %x: tensor<2x8x20xf32> loc("x")) -> (tensor<2x20xf32>, tensor<2x8xf32>) {
    %0 = tensor.empty() : tensor<2x8xf32> loc("m")
    %1 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%mask : tensor<2x8xi64>) outs(%0 : tensor<2x8xf32>) {
    ^bb0(%2: i64, %3: f32):
      %4 = arith.sitofp %2 : i64 to f32
      linalg.yield %4 : f32
    } -> tensor<2x8xf32> loc("m")
    %5 = tensor.empty() : tensor<2x8x20xf32> loc("masked")
    %6 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1, d2)>, affine_map<(d0, d1, d2) -> (d0, d1)>, affine_map<(d0, d1, d2) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel"]} ins(%x, %1 : tensor<2x8x20xf32>, tensor<2x8xf32>) outs(%5 : tensor<2x8x20xf32>) {
    ^bb0(%7: f32, %8: f32, %9: f32):
      %10 = arith.mulf %7, %8 : f32
      linalg.yield %10 : f32
    } -> tensor<2x8x20xf32> loc("masked")
    %11 = tensor.empty() : tensor<2x20xf32> loc("total")
    %12 = arith.constant 0.0 : f32 loc("total")
    %13 = linalg.fill ins(%12 : f32) outs(%11 : tensor<2x20xf32>) -> tensor<2x20xf32> loc("total")
    %14 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1, d2)>, affine_map<(d0, d1, d2) -> (d0, d2)>], iterator_types = ["parallel", "reduction", "parallel"]} ins(%6 : tensor<2x8x20xf32>) outs(%13 : tensor<2x20xf32>) {
    ^bb0(%15: f32, %16: f32):
      %17 = arith.addf %15, %16 : f32
      linalg.yield %17 : f32
    } -> tensor<2x20xf32> loc("total")
    %18 = tensor.empty() : tensor<2xf32> loc("count")
    %19 = arith.constant 0.0 : f32 loc("count")
    %20 = linalg.fill ins(%19 : f32) outs(%18 : tensor<2xf32>) -> tensor<2xf32> loc("count")
    %21 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>], iterator_types = ["parallel", "reduction"]} ins(%1 : tensor<2x8xf32>) outs(%20 : tensor<2xf32>) {
    ^bb0(%22: f32, %23: f32):
      %24 = arith.addf %22, %23 : f32
      linalg.yield %24 : f32
    } -> tensor<2xf32> loc("count")
    %25 = tensor.empty() : tensor<2xf32> loc("clamp")
    %26 = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>], iterator_types = ["parallel"]} ins(%21 : tensor<2xf32>) outs(%25 : tensor<2xf32>) {
    ^bb0(%27: f32, %28: f32):
      %29 = arith.constant 1.0 : f32
      %30 = arith.maximumf %27, %29 : f32
      linalg.yield %30 : f32
    } -> tensor<2xf32> loc("clamp")
    %31 = tensor.empty() : tensor<2x20xf32> loc("mean")
    %32 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%14, %26 : tensor<2x20xf32>, tensor<2xf32>) outs(%31 : tensor<2x20xf32>) {
    ^bb0(%33: f32, %34: f32, %35: f32):
      %36 = arith.divf %33, %34 : f32
      linalg.yield %36 : f32
    } -> tensor<2x20xf32> loc("mean")
    return %32, %1 : tensor<2x20xf32>, tensor<2x8xf32>
  } loc("count_returned")
}
