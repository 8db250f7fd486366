// Printed by torch-mlir 20261001 (torch_mlir.fx.export_and_import(model, *args, output_type="linalg-on-tensors"), torch 2.13.0); unedited. Model: see test/unit/test_contract.py.
#map = affine_map<(d0, d1) -> (d0, d1)>
#map1 = affine_map<(d0, d1) -> ()>
module {
  func.func @main(%arg0: tensor<4x8xf32>, %arg1: tensor<4x8xf32>) -> tensor<4x8xf32> {
    %cst = arith.constant dense<-1.000000e+09> : tensor<f32>
    %0 = tensor.empty() : tensor<4x8xi1>
    %1 = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel"]} ins(%arg0, %arg1 : tensor<4x8xf32>, tensor<4x8xf32>) outs(%0 : tensor<4x8xi1>) {
    ^bb0(%in: f32, %in_0: f32, %out: i1):
      %4 = arith.cmpf ogt, %in, %in_0 : f32
      linalg.yield %4 : i1
    } -> tensor<4x8xi1>
    %2 = tensor.empty() : tensor<4x8xf32>
    %3 = linalg.generic {indexing_maps = [#map, #map1, #map, #map], iterator_types = ["parallel", "parallel"]} ins(%1, %cst, %arg0 : tensor<4x8xi1>, tensor<f32>, tensor<4x8xf32>) outs(%2 : tensor<4x8xf32>) {
    ^bb0(%in: i1, %in_0: f32, %in_1: f32, %out: f32):
      %4 = arith.select %in, %in_0, %in_1 : f32
      linalg.yield %4 : f32
    } -> tensor<4x8xf32>
    return %3 : tensor<4x8xf32>
  }
}
