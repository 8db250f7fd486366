// Printed by torch-mlir 20261001 (torch_mlir.fx.export_and_import(model, *args, output_type="linalg-on-tensors"), torch 2.13.0); unedited. Model: see test/unit/test_contract.py.
#map = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#map1 = affine_map<(d0, d1, d2) -> ()>
#map2 = affine_map<(d0, d1, d2) -> (d0, d1)>
#map3 = affine_map<(d0, d1, d2) -> (d0, d1, 0)>
module {
  func.func @main(%arg0: tensor<2x4x8xf32>, %arg1: tensor<2x4x8xf32>) -> tensor<2x4x8xf32> {
    %c0_i64 = arith.constant 0 : i64
    %cst = arith.constant 0xFF800000 : f32
    %cst_0 = arith.constant 0.000000e+00 : f32
    %cst_1 = arith.constant dense<0xFF800000> : tensor<f32>
    %0 = tensor.empty() : tensor<2x4x8xi1>
    %1 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel", "parallel"]} ins(%arg1 : tensor<2x4x8xf32>) outs(%0 : tensor<2x4x8xi1>) {
    ^bb0(%in: f32, %out: i1):
      %15 = arith.cmpf olt, %in, %cst_0 : f32
      linalg.yield %15 : i1
    } -> tensor<2x4x8xi1>
    %2 = tensor.empty() : tensor<2x4x8xf32>
    %3 = linalg.generic {indexing_maps = [#map, #map1, #map, #map], iterator_types = ["parallel", "parallel", "parallel"]} ins(%1, %cst_1, %arg0 : tensor<2x4x8xi1>, tensor<f32>, tensor<2x4x8xf32>) outs(%2 : tensor<2x4x8xf32>) {
    ^bb0(%in: i1, %in_2: f32, %in_3: f32, %out: f32):
      %15 = arith.select %in, %in_2, %in_3 : f32
      linalg.yield %15 : f32
    } -> tensor<2x4x8xf32>
    %4 = tensor.empty() : tensor<2x4xi64>
    %5 = linalg.fill ins(%c0_i64 : i64) outs(%4 : tensor<2x4xi64>) -> tensor<2x4xi64>
    %6 = tensor.empty() : tensor<2x4xf32>
    %7 = linalg.fill ins(%cst : f32) outs(%6 : tensor<2x4xf32>) -> tensor<2x4xf32>
    %8:2 = linalg.generic {indexing_maps = [#map, #map2, #map2], iterator_types = ["parallel", "parallel", "reduction"]} ins(%3 : tensor<2x4x8xf32>) outs(%7, %5 : tensor<2x4xf32>, tensor<2x4xi64>) {
    ^bb0(%in: f32, %out: f32, %out_2: i64):
      %15 = linalg.index 2 : index
      %16 = arith.index_cast %15 : index to i64
      %17 = arith.maximumf %in, %out : f32
      %18 = arith.cmpf ogt, %in, %out : f32
      %19 = arith.select %18, %16, %out_2 : i64
      linalg.yield %17, %19 : f32, i64
    } -> (tensor<2x4xf32>, tensor<2x4xi64>)
    %expanded = tensor.expand_shape %8#0 [[0], [1, 2]] output_shape [2, 4, 1] : tensor<2x4xf32> into tensor<2x4x1xf32>
    %9 = linalg.generic {indexing_maps = [#map, #map3, #map], iterator_types = ["parallel", "parallel", "parallel"]} ins(%3, %expanded : tensor<2x4x8xf32>, tensor<2x4x1xf32>) outs(%2 : tensor<2x4x8xf32>) {
    ^bb0(%in: f32, %in_2: f32, %out: f32):
      %15 = arith.subf %in, %in_2 : f32
      linalg.yield %15 : f32
    } -> tensor<2x4x8xf32>
    %10 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel", "parallel"]} ins(%9 : tensor<2x4x8xf32>) outs(%2 : tensor<2x4x8xf32>) {
    ^bb0(%in: f32, %out: f32):
      %15 = math.exp %in : f32
      linalg.yield %15 : f32
    } -> tensor<2x4x8xf32>
    %11 = tensor.empty() : tensor<2x4x1xf32>
    %12 = linalg.fill ins(%cst_0 : f32) outs(%11 : tensor<2x4x1xf32>) -> tensor<2x4x1xf32>
    %13 = linalg.generic {indexing_maps = [#map, #map3], iterator_types = ["parallel", "parallel", "reduction"]} ins(%10 : tensor<2x4x8xf32>) outs(%12 : tensor<2x4x1xf32>) {
    ^bb0(%in: f32, %out: f32):
      %15 = arith.addf %in, %out : f32
      linalg.yield %15 : f32
    } -> tensor<2x4x1xf32>
    %14 = linalg.generic {indexing_maps = [#map, #map3, #map], iterator_types = ["parallel", "parallel", "parallel"]} ins(%10, %13 : tensor<2x4x8xf32>, tensor<2x4x1xf32>) outs(%2 : tensor<2x4x8xf32>) {
    ^bb0(%in: f32, %in_2: f32, %out: f32):
      %15 = arith.divf %in, %in_2 : f32
      linalg.yield %15 : f32
    } -> tensor<2x4x8xf32>
    return %14 : tensor<2x4x8xf32>
  }
}
