// Printed by torch-mlir 20261001 (torch_mlir.fx.export_and_import(model, *args, output_type="linalg-on-tensors"), torch 2.13.0); unedited. Model: see test/unit/test_contract.py.
#map = affine_map<(d0, d1) -> (d0, d1)>
#map1 = affine_map<(d0, d1) -> (d0)>
#map2 = affine_map<(d0) -> (d0)>
module {
  func.func @main(%arg0: tensor<4x8xf32>) -> tensor<4xf32> {
    %true = arith.constant true
    %cst = arith.constant 0.000000e+00 : f32
    %0 = tensor.empty() : tensor<4x8xi1>
    %1 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%arg0 : tensor<4x8xf32>) outs(%0 : tensor<4x8xi1>) {
    ^bb0(%in: f32, %out: i1):
      %10 = arith.cmpf ogt, %in, %cst : f32
      linalg.yield %10 : i1
    } -> tensor<4x8xi1>
    %2 = tensor.empty() : tensor<4xi1>
    %3 = linalg.fill ins(%true : i1) outs(%2 : tensor<4xi1>) -> tensor<4xi1>
    %4 = linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "reduction"]} ins(%1 : tensor<4x8xi1>) outs(%3 : tensor<4xi1>) {
    ^bb0(%in: i1, %out: i1):
      %10 = arith.andi %in, %out : i1
      linalg.yield %10 : i1
    } -> tensor<4xi1>
    %5 = tensor.empty() : tensor<4xf32>
    %6 = linalg.generic {indexing_maps = [#map2, #map2], iterator_types = ["parallel"]} ins(%4 : tensor<4xi1>) outs(%5 : tensor<4xf32>) {
    ^bb0(%in: i1, %out: f32):
      %10 = arith.uitofp %in : i1 to f32
      linalg.yield %10 : f32
    } -> tensor<4xf32>
    %7 = linalg.fill ins(%cst : f32) outs(%5 : tensor<4xf32>) -> tensor<4xf32>
    %8 = linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "reduction"]} ins(%arg0 : tensor<4x8xf32>) outs(%7 : tensor<4xf32>) {
    ^bb0(%in: f32, %out: f32):
      %10 = arith.addf %in, %out : f32
      linalg.yield %10 : f32
    } -> tensor<4xf32>
    %9 = linalg.generic {indexing_maps = [#map2, #map2, #map2], iterator_types = ["parallel"]} ins(%6, %8 : tensor<4xf32>, tensor<4xf32>) outs(%5 : tensor<4xf32>) {
    ^bb0(%in: f32, %in_0: f32, %out: f32):
      %10 = arith.addf %in, %in_0 : f32
      linalg.yield %10 : f32
    } -> tensor<4xf32>
    return %9 : tensor<4xf32>
  }
}
