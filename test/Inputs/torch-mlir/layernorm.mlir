// torch-mlir output of torch.nn.LayerNorm(64) with random weight and bias, x: 32x64 (see export.py in this folder: the wheel, the
// call; printed as is, parsed unchanged by the MLIR 22.1.8 bindings).
#map = affine_map<(d0, d1) -> (d0, d1)>
#map1 = affine_map<(d0, d1) -> (d0, 0)>
#map2 = affine_map<(d0, d1) -> (d1)>
module {
  func.func @main(%arg0: tensor<32x64xf32>) -> tensor<32x64xf32> {
    %cst = arith.constant 0.000000e+00 : f64
    %cst_0 = arith.constant 0.000000e+00 : f32
    %cst_1 = arith.constant dense_resource<torch_tensor_64_torch.float32_1> : tensor<64xf32>
    %cst_2 = arith.constant dense_resource<torch_tensor_64_torch.float32> : tensor<64xf32>
    %cst_3 = arith.constant 1.000000e-05 : f64
    %cst_4 = arith.constant 6.400000e+01 : f64
    %cst_5 = arith.constant 6.400000e+01 : f32
    %0 = tensor.empty() : tensor<32x64xf64>
    %1 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%arg0 : tensor<32x64xf32>) outs(%0 : tensor<32x64xf64>) {
    ^bb0(%in: f32, %out: f64):
      %22 = arith.extf %in : f32 to f64
      linalg.yield %22 : f64
    } -> tensor<32x64xf64>
    %2 = tensor.empty() : tensor<32x1xf64>
    %3 = linalg.fill ins(%cst : f64) outs(%2 : tensor<32x1xf64>) -> tensor<32x1xf64>
    %4 = linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "reduction"]} ins(%1 : tensor<32x64xf64>) outs(%3 : tensor<32x1xf64>) {
    ^bb0(%in: f64, %out: f64):
      %22 = arith.addf %in, %out : f64
      linalg.yield %22 : f64
    } -> tensor<32x1xf64>
    %5 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%4 : tensor<32x1xf64>) outs(%2 : tensor<32x1xf64>) {
    ^bb0(%in: f64, %out: f64):
      %22 = arith.divf %in, %cst_4 : f64
      linalg.yield %22 : f64
    } -> tensor<32x1xf64>
    %6 = linalg.generic {indexing_maps = [#map, #map1, #map], iterator_types = ["parallel", "parallel"]} ins(%1, %5 : tensor<32x64xf64>, tensor<32x1xf64>) outs(%0 : tensor<32x64xf64>) {
    ^bb0(%in: f64, %in_6: f64, %out: f64):
      %22 = arith.subf %in, %in_6 : f64
      linalg.yield %22 : f64
    } -> tensor<32x64xf64>
    %7 = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel"]} ins(%6, %6 : tensor<32x64xf64>, tensor<32x64xf64>) outs(%0 : tensor<32x64xf64>) {
    ^bb0(%in: f64, %in_6: f64, %out: f64):
      %22 = arith.mulf %in, %in_6 : f64
      linalg.yield %22 : f64
    } -> tensor<32x64xf64>
    %8 = linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "reduction"]} ins(%7 : tensor<32x64xf64>) outs(%3 : tensor<32x1xf64>) {
    ^bb0(%in: f64, %out: f64):
      %22 = arith.addf %in, %out : f64
      linalg.yield %22 : f64
    } -> tensor<32x1xf64>
    %9 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%8 : tensor<32x1xf64>) outs(%2 : tensor<32x1xf64>) {
    ^bb0(%in: f64, %out: f64):
      %22 = arith.divf %in, %cst_4 : f64
      linalg.yield %22 : f64
    } -> tensor<32x1xf64>
    %10 = tensor.empty() : tensor<32x1xf32>
    %11 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%9 : tensor<32x1xf64>) outs(%10 : tensor<32x1xf32>) {
    ^bb0(%in: f64, %out: f32):
      %22 = arith.truncf %in : f64 to f32
      linalg.yield %22 : f32
    } -> tensor<32x1xf32>
    %12 = linalg.fill ins(%cst_0 : f32) outs(%10 : tensor<32x1xf32>) -> tensor<32x1xf32>
    %13 = linalg.generic {indexing_maps = [#map, #map1], iterator_types = ["parallel", "reduction"]} ins(%arg0 : tensor<32x64xf32>) outs(%12 : tensor<32x1xf32>) {
    ^bb0(%in: f32, %out: f32):
      %22 = arith.addf %in, %out : f32
      linalg.yield %22 : f32
    } -> tensor<32x1xf32>
    %14 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%13 : tensor<32x1xf32>) outs(%10 : tensor<32x1xf32>) {
    ^bb0(%in: f32, %out: f32):
      %22 = arith.divf %in, %cst_5 : f32
      linalg.yield %22 : f32
    } -> tensor<32x1xf32>
    %15 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%11 : tensor<32x1xf32>) outs(%10 : tensor<32x1xf32>) {
    ^bb0(%in: f32, %out: f32):
      %22 = arith.truncf %cst_3 : f64 to f32
      %23 = arith.addf %in, %22 : f32
      linalg.yield %23 : f32
    } -> tensor<32x1xf32>
    %16 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%15 : tensor<32x1xf32>) outs(%10 : tensor<32x1xf32>) {
    ^bb0(%in: f32, %out: f32):
      %22 = math.rsqrt %in : f32
      linalg.yield %22 : f32
    } -> tensor<32x1xf32>
    %17 = tensor.empty() : tensor<32x64xf32>
    %18 = linalg.generic {indexing_maps = [#map, #map1, #map], iterator_types = ["parallel", "parallel"]} ins(%arg0, %14 : tensor<32x64xf32>, tensor<32x1xf32>) outs(%17 : tensor<32x64xf32>) {
    ^bb0(%in: f32, %in_6: f32, %out: f32):
      %22 = arith.subf %in, %in_6 : f32
      linalg.yield %22 : f32
    } -> tensor<32x64xf32>
    %19 = linalg.generic {indexing_maps = [#map, #map1, #map], iterator_types = ["parallel", "parallel"]} ins(%18, %16 : tensor<32x64xf32>, tensor<32x1xf32>) outs(%17 : tensor<32x64xf32>) {
    ^bb0(%in: f32, %in_6: f32, %out: f32):
      %22 = arith.mulf %in, %in_6 : f32
      linalg.yield %22 : f32
    } -> tensor<32x64xf32>
    %20 = linalg.generic {indexing_maps = [#map, #map2, #map], iterator_types = ["parallel", "parallel"]} ins(%19, %cst_2 : tensor<32x64xf32>, tensor<64xf32>) outs(%17 : tensor<32x64xf32>) {
    ^bb0(%in: f32, %in_6: f32, %out: f32):
      %22 = arith.mulf %in, %in_6 : f32
      linalg.yield %22 : f32
    } -> tensor<32x64xf32>
    %21 = linalg.generic {indexing_maps = [#map, #map2, #map], iterator_types = ["parallel", "parallel"]} ins(%20, %cst_1 : tensor<32x64xf32>, tensor<64xf32>) outs(%17 : tensor<32x64xf32>) {
    ^bb0(%in: f32, %in_6: f32, %out: f32):
      %22 = arith.addf %in, %in_6 : f32
      linalg.yield %22 : f32
    } -> tensor<32x64xf32>
    return %21 : tensor<32x64xf32>
  }
}

{-#
  dialect_resources: {
    builtin: {
      torch_tensor_64_torch.float32_1: "0x040000006E898C3E203F81BD40649C3C0044ED3D00D19E3E48CFF53E9647C5BEECA13BBE9838493ED01BD43EE8C5DE3E22E2E13E78CACB3DF89CDEBE90663C3DAC27A0BE8C94EEBE3E74E33EF0A6C23EFE5DFFBE08AABF3DC880ACBDB882A8BD1C5F6ABE8CE4443E34A197BEDCB13B3E1676813E5C43B73E48713F3E4A5FFDBE0011A6BE38A67F3E1853D63D96B3C7BEE86893BEF2D4F03E547FAC3EB03E5FBED4DC00BE78DDF3BE803E13BC78C8C0BEA277C5BE20B0E1BCA0BF993DF4AD51BE98E7973E38C99BBE6849E83ED06FAF3E64E1D7BE88DBFEBD80D2B83C1867953DD0DDF23D5CEC483EE059F53CCCD179BED445723E5691F5BEA0BB97BE3C2B00BEEC6679BE",
      torch_tensor_64_torch.float32: "0x04000000AC0A7F3F1855A23F75A6163FC0CC213F43B34E3F7E29913FC3767D3FB4BEB23F09A4743F6AEF903F1551593FF2D6663F24B7053F573A2B3F463C4B3FEC5E823F2C4D993FC666A63F3A39293FC142483FF33E973F1425B53F57A8653F57E4AF3F585E6B3FA8C5863F52F3B93F1942093F4D6B2F3F48985F3F091B4E3FCA4BB73F73082D3FD013453FF392263FC51E083FFE47353FA803B73FD88E9C3FE0049F3FA95D833F63603E3FECD38A3FB17C083FF382233F1D033E3F4A61A83F4A86A53F8E3B473FA7617B3F90EEA83FE09FBF3F8466993F5CA5883F40E9AA3F20A2343F10ED8B3FCAC21C3FF448273F97E03D3F52F59C3FFFBC993FCB2D343FB955933F"
    }
  }
#-}
