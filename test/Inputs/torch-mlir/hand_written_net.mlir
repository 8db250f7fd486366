// A torch-mlir-style module, written by hand after the real torch-mlir outputs in this
// folder (conv_relu.mlir, layernorm.mlir; the masked softmax as torch-mlir prints GPT-2's
// causal-mask buffer): a named module with attributes, dense_resource weights (the
// convolution's filter and bias, the LayerNorm's weight and bias, the bool mask stored as
// i8), i1 tensors inside the function, reductions that keep the reduced dim
// ((d0, d1) -> (d0, 0), or a reduction expanded to 16x1), tensor.pad before
// linalg.conv_2d_nchw_fchw with the bias broadcast into its init. Three independent
// branches, so each one's kernel count reads on its own in the report; every op is named
// after its branch. The weights are numpy.random.default_rng(7).uniform(-0.5, 0.5)
// (conv filter 4x3x3x3, then conv bias 4), uniform(0.5, 1.5) (LayerNorm weight 32),
// uniform(-0.5, 0.5) (LayerNorm bias 32) as f32, the mask numpy.tril of ones (16x16).
// Checked by test/unit/test_torch_mlir_style.py.
#map = affine_map<(d0, d1) -> (d0, d1)>
#map1 = affine_map<(d0, d1) -> ()>
#map2 = affine_map<(d0, d1) -> (d0)>
#map3 = affine_map<(d0, d1) -> (d0, 0)>
#map4 = affine_map<(d0, d1) -> (d1)>
#map5 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
module @tiny_net attributes {torch.debug_module_name = "TinyNet"} {
  func.func @main(%arg0: tensor<1x3x8x8xf32>, %arg1: tensor<16x16xf32>, %arg2: tensor<16x32xf32>) -> (tensor<1x4x8x8xf32>, tensor<16x16xf32>, tensor<16x32xf32>) {
    %c0_i8 = arith.constant 0 : i8
    %true = arith.constant true
    %cst = arith.constant 0.000000e+00 : f32
    %cst_0 = arith.constant 0xFF800000 : f32
    %cst_1 = arith.constant dense<0xFF800000> : tensor<f32>
    %cst_2 = arith.constant 0.000000e+00 : f64
    %cst_3 = arith.constant 1.000000e-05 : f64
    %cst_4 = arith.constant 3.200000e+01 : f64
    %cst_5 = arith.constant 3.200000e+01 : f32
    %cst_6 = arith.constant dense_resource<torch_tensor_4_3_3_3_torch.float32> : tensor<4x3x3x3xf32>
    %cst_7 = arith.constant dense_resource<torch_tensor_4_torch.float32> : tensor<4xf32>
    %cst_8 = arith.constant dense_resource<torch_tensor_16_16_torch.uint8> : tensor<16x16xi8>
    %cst_9 = arith.constant dense_resource<torch_tensor_32_torch.float32> : tensor<32xf32>
    %cst_10 = arith.constant dense_resource<torch_tensor_32_torch.float32_1> : tensor<32xf32>
    %padded = tensor.pad %arg0 low[0, 0, 1, 1] high[0, 0, 1, 1] {
    ^bb0(%arg3: index, %arg4: index, %arg5: index, %arg6: index):
      tensor.yield %cst : f32
    } : tensor<1x3x8x8xf32> to tensor<1x3x10x10xf32> loc("conv.pad")
    %0 = tensor.empty() : tensor<1x4x8x8xf32>
    %broadcasted = linalg.broadcast ins(%cst_7 : tensor<4xf32>) outs(%0 : tensor<1x4x8x8xf32>) dimensions = [0, 2, 3]  loc("conv.bias")
    %1 = linalg.conv_2d_nchw_fchw {dilations = dense<1> : vector<2xi64>, strides = dense<1> : vector<2xi64>} ins(%padded, %cst_6 : tensor<1x3x10x10xf32>, tensor<4x3x3x3xf32>) outs(%broadcasted : tensor<1x4x8x8xf32>) -> tensor<1x4x8x8xf32> loc("conv.conv")
    %2 = linalg.generic {indexing_maps = [#map5, #map5], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%1 : tensor<1x4x8x8xf32>) outs(%0 : tensor<1x4x8x8xf32>) {
    ^bb0(%in: f32, %out: f32):
      %40 = arith.cmpf ugt, %in, %cst : f32
      %41 = arith.select %40, %in, %cst : f32
      linalg.yield %41 : f32
    } -> tensor<1x4x8x8xf32> loc("conv.relu")
    %3 = tensor.empty() : tensor<16x16xi1>
    %4 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%cst_8 : tensor<16x16xi8>) outs(%3 : tensor<16x16xi1>) {
    ^bb0(%in: i8, %out: i1):
      %40 = arith.cmpi ne, %in, %c0_i8 : i8
      linalg.yield %40 : i1
    } -> tensor<16x16xi1> loc("softmax.mask")
    %5 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%4 : tensor<16x16xi1>) outs(%3 : tensor<16x16xi1>) {
    ^bb0(%in: i1, %out: i1):
      %40 = arith.xori %in, %true : i1
      linalg.yield %40 : i1
    } -> tensor<16x16xi1> loc("softmax.not")
    %6 = tensor.empty() : tensor<16x16xf32>
    %7 = linalg.generic {indexing_maps = [#map, #map1, #map, #map], iterator_types = ["parallel", "parallel"]} ins(%5, %cst_1, %arg1 : tensor<16x16xi1>, tensor<f32>, tensor<16x16xf32>) outs(%6 : tensor<16x16xf32>) {
    ^bb0(%in: i1, %in_11: f32, %in_12: f32, %out: f32):
      %40 = arith.select %in, %in_11, %in_12 : f32
      linalg.yield %40 : f32
    } -> tensor<16x16xf32> loc("softmax.masked_fill")
    %8 = tensor.empty() : tensor<16xf32>
    %9 = linalg.fill ins(%cst_0 : f32) outs(%8 : tensor<16xf32>) -> tensor<16xf32> loc("softmax.max_init")
    %10 = linalg.generic {indexing_maps = [#map, #map2], iterator_types = ["parallel", "reduction"]} ins(%7 : tensor<16x16xf32>) outs(%9 : tensor<16xf32>) {
    ^bb0(%in: f32, %out: f32):
      %40 = arith.maximumf %in, %out : f32
      linalg.yield %40 : f32
    } -> tensor<16xf32> loc("softmax.max")
    %expanded = tensor.expand_shape %10 [[0, 1]] output_shape [16, 1] : tensor<16xf32> into tensor<16x1xf32> loc("softmax.max_keepdim")
    %11 = linalg.generic {indexing_maps = [#map, #map3, #map], iterator_types = ["parallel", "parallel"]} ins(%7, %expanded : tensor<16x16xf32>, tensor<16x1xf32>) outs(%6 : tensor<16x16xf32>) {
    ^bb0(%in: f32, %in_11: f32, %out: f32):
      %40 = arith.subf %in, %in_11 : f32
      linalg.yield %40 : f32
    } -> tensor<16x16xf32> loc("softmax.sub")
    %12 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%11 : tensor<16x16xf32>) outs(%6 : tensor<16x16xf32>) {
    ^bb0(%in: f32, %out: f32):
      %40 = math.exp %in : f32
      linalg.yield %40 : f32
    } -> tensor<16x16xf32> loc("softmax.exp")
    %13 = tensor.empty() : tensor<16x1xf32>
    %14 = linalg.fill ins(%cst : f32) outs(%13 : tensor<16x1xf32>) -> tensor<16x1xf32> loc("softmax.sum_init")
    %15 = linalg.generic {indexing_maps = [#map, #map3], iterator_types = ["parallel", "reduction"]} ins(%12 : tensor<16x16xf32>) outs(%14 : tensor<16x1xf32>) {
    ^bb0(%in: f32, %out: f32):
      %40 = arith.addf %in, %out : f32
      linalg.yield %40 : f32
    } -> tensor<16x1xf32> loc("softmax.sum")
    %16 = linalg.generic {indexing_maps = [#map, #map3, #map], iterator_types = ["parallel", "parallel"]} ins(%12, %15 : tensor<16x16xf32>, tensor<16x1xf32>) outs(%6 : tensor<16x16xf32>) {
    ^bb0(%in: f32, %in_11: f32, %out: f32):
      %40 = arith.divf %in, %in_11 : f32
      linalg.yield %40 : f32
    } -> tensor<16x16xf32> loc("softmax.div")
    %17 = tensor.empty() : tensor<16x32xf64>
    %18 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%arg2 : tensor<16x32xf32>) outs(%17 : tensor<16x32xf64>) {
    ^bb0(%in: f32, %out: f64):
      %40 = arith.extf %in : f32 to f64
      linalg.yield %40 : f64
    } -> tensor<16x32xf64> loc("layernorm.to_f64")
    %19 = tensor.empty() : tensor<16x1xf64>
    %20 = linalg.fill ins(%cst_2 : f64) outs(%19 : tensor<16x1xf64>) -> tensor<16x1xf64> loc("layernorm.sum_init")
    %21 = linalg.generic {indexing_maps = [#map, #map3], iterator_types = ["parallel", "reduction"]} ins(%18 : tensor<16x32xf64>) outs(%20 : tensor<16x1xf64>) {
    ^bb0(%in: f64, %out: f64):
      %40 = arith.addf %in, %out : f64
      linalg.yield %40 : f64
    } -> tensor<16x1xf64> loc("layernorm.sum")
    %22 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%21 : tensor<16x1xf64>) outs(%19 : tensor<16x1xf64>) {
    ^bb0(%in: f64, %out: f64):
      %40 = arith.divf %in, %cst_4 : f64
      linalg.yield %40 : f64
    } -> tensor<16x1xf64> loc("layernorm.mean64")
    %23 = linalg.generic {indexing_maps = [#map, #map3, #map], iterator_types = ["parallel", "parallel"]} ins(%18, %22 : tensor<16x32xf64>, tensor<16x1xf64>) outs(%17 : tensor<16x32xf64>) {
    ^bb0(%in: f64, %in_11: f64, %out: f64):
      %40 = arith.subf %in, %in_11 : f64
      linalg.yield %40 : f64
    } -> tensor<16x32xf64> loc("layernorm.centred64")
    %24 = linalg.generic {indexing_maps = [#map, #map, #map], iterator_types = ["parallel", "parallel"]} ins(%23, %23 : tensor<16x32xf64>, tensor<16x32xf64>) outs(%17 : tensor<16x32xf64>) {
    ^bb0(%in: f64, %in_11: f64, %out: f64):
      %40 = arith.mulf %in, %in_11 : f64
      linalg.yield %40 : f64
    } -> tensor<16x32xf64> loc("layernorm.square")
    %25 = linalg.generic {indexing_maps = [#map, #map3], iterator_types = ["parallel", "reduction"]} ins(%24 : tensor<16x32xf64>) outs(%20 : tensor<16x1xf64>) {
    ^bb0(%in: f64, %out: f64):
      %40 = arith.addf %in, %out : f64
      linalg.yield %40 : f64
    } -> tensor<16x1xf64> loc("layernorm.sum_squares")
    %26 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%25 : tensor<16x1xf64>) outs(%19 : tensor<16x1xf64>) {
    ^bb0(%in: f64, %out: f64):
      %40 = arith.divf %in, %cst_4 : f64
      linalg.yield %40 : f64
    } -> tensor<16x1xf64> loc("layernorm.var64")
    %27 = tensor.empty() : tensor<16x1xf32>
    %28 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%26 : tensor<16x1xf64>) outs(%27 : tensor<16x1xf32>) {
    ^bb0(%in: f64, %out: f32):
      %40 = arith.truncf %in : f64 to f32
      linalg.yield %40 : f32
    } -> tensor<16x1xf32> loc("layernorm.var")
    %29 = linalg.fill ins(%cst : f32) outs(%27 : tensor<16x1xf32>) -> tensor<16x1xf32> loc("layernorm.mean_init")
    %30 = linalg.generic {indexing_maps = [#map, #map3], iterator_types = ["parallel", "reduction"]} ins(%arg2 : tensor<16x32xf32>) outs(%29 : tensor<16x1xf32>) {
    ^bb0(%in: f32, %out: f32):
      %40 = arith.addf %in, %out : f32
      linalg.yield %40 : f32
    } -> tensor<16x1xf32> loc("layernorm.sum32")
    %31 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%30 : tensor<16x1xf32>) outs(%27 : tensor<16x1xf32>) {
    ^bb0(%in: f32, %out: f32):
      %40 = arith.divf %in, %cst_5 : f32
      linalg.yield %40 : f32
    } -> tensor<16x1xf32> loc("layernorm.mean")
    %32 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%28 : tensor<16x1xf32>) outs(%27 : tensor<16x1xf32>) {
    ^bb0(%in: f32, %out: f32):
      %40 = arith.truncf %cst_3 : f64 to f32
      %41 = arith.addf %in, %40 : f32
      linalg.yield %41 : f32
    } -> tensor<16x1xf32> loc("layernorm.add_eps")
    %33 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel"]} ins(%32 : tensor<16x1xf32>) outs(%27 : tensor<16x1xf32>) {
    ^bb0(%in: f32, %out: f32):
      %40 = math.rsqrt %in : f32
      linalg.yield %40 : f32
    } -> tensor<16x1xf32> loc("layernorm.rsqrt")
    %34 = tensor.empty() : tensor<16x32xf32>
    %35 = linalg.generic {indexing_maps = [#map, #map3, #map], iterator_types = ["parallel", "parallel"]} ins(%arg2, %31 : tensor<16x32xf32>, tensor<16x1xf32>) outs(%34 : tensor<16x32xf32>) {
    ^bb0(%in: f32, %in_11: f32, %out: f32):
      %40 = arith.subf %in, %in_11 : f32
      linalg.yield %40 : f32
    } -> tensor<16x32xf32> loc("layernorm.sub")
    %36 = linalg.generic {indexing_maps = [#map, #map3, #map], iterator_types = ["parallel", "parallel"]} ins(%35, %33 : tensor<16x32xf32>, tensor<16x1xf32>) outs(%34 : tensor<16x32xf32>) {
    ^bb0(%in: f32, %in_11: f32, %out: f32):
      %40 = arith.mulf %in, %in_11 : f32
      linalg.yield %40 : f32
    } -> tensor<16x32xf32> loc("layernorm.normalize")
    %37 = linalg.generic {indexing_maps = [#map, #map4, #map], iterator_types = ["parallel", "parallel"]} ins(%36, %cst_9 : tensor<16x32xf32>, tensor<32xf32>) outs(%34 : tensor<16x32xf32>) {
    ^bb0(%in: f32, %in_11: f32, %out: f32):
      %40 = arith.mulf %in, %in_11 : f32
      linalg.yield %40 : f32
    } -> tensor<16x32xf32> loc("layernorm.weight")
    %38 = linalg.generic {indexing_maps = [#map, #map4, #map], iterator_types = ["parallel", "parallel"]} ins(%37, %cst_10 : tensor<16x32xf32>, tensor<32xf32>) outs(%34 : tensor<16x32xf32>) {
    ^bb0(%in: f32, %in_11: f32, %out: f32):
      %40 = arith.addf %in, %in_11 : f32
      linalg.yield %40 : f32
    } -> tensor<16x32xf32> loc("layernorm.bias")
    return %2, %16, %38 : tensor<1x4x8x8xf32>, tensor<16x16xf32>, tensor<16x32xf32>
  }
}

{-#
  dialect_resources: {
    builtin: {
      torch_tensor_4_3_3_3_torch.float32: "0x040000000719003E9B5FCB3EAD268D3EA5B18CBE36A14CBE6642BF3EDE4DFDBE0D78A43E7C19983EA45603BDDEB149BE65E462BE78037BBEABF760BD9009953B0A205B3D37B2FD3EC8D7953E1B39FA3DFC58FA3E0FC391BEB0F8ADBE2A7BE63D6F80E9BE51BBEDBE3DF0733C8D6B0ABD0497D53EE353043EB44D673C0DE74CBBB94581BE22F6F9BE777D9DBE11A4443E134A99BE469805BE8C16FEBE04FCA83E7AEAB0BE73FA6DBEE5BAC23EA269203CADBDB13E04120F3ECE92773E7D27D1BE6C86283D3EAEFE3B3220BE3ECB100EBEBA14C93DC5A9E1BE4C21E6BDF63535BE0519B3BE11F7A13EEDE4F6BD711EF53E914DB83DBC27D73DFA4E0D3E5FAF343EEACBB2BEDE7974BDDF5785BEF9AEC7BDCD7CCEBE2987EF3EFEEA91BE35E32F3EAE5E4CBE0687BF3E9F1B263EDA9CBCBE95ADB03E3FD0E33E2ECECE3EEAC88E3D4686B5BE6D759DBE7416DB3E4D54563D9F8EA3BE1BA3C43E2CF8103EDFBB8E3DCE5CFDBD145DB6BDAB6185BEC183ECBEC09FC03E522D04BD201D433DD21A36BEA9AD803E6519F3BEDDE102BEED75F0BE4914C1BE0E2EEF3E078C213E430193BD9D7AC23CD9E0BE3E3D871FBE7BEAB83DC2173C3E",
      torch_tensor_4_torch.float32: "0x04000000690E14BE6E749C3C81CE873EF37FD13E",
      torch_tensor_16_16_torch.uint8: "0x0100000001000000000000000000000000000000010100000000000000000000000000000101010000000000000000000000000001010101000000000000000000000000010101010100000000000000000000000101010101010000000000000000000001010101010101000000000000000000010101010101010100000000000000000101010101010101010000000000000001010101010101010101000000000000010101010101010101010100000000000101010101010101010101010000000001010101010101010101010101000000010101010101010101010101010100000101010101010101010101010101010001010101010101010101010101010101",
      torch_tensor_32_torch.float32: "0x0400000004AC263F497AB73F6753013F9161A03F58BFA73FF802233F453D6B3F515AA83F47A7033F7171903FCD81A53F1AAA813FA2E89C3FE4F6393F48D2323FE3F55C3F8EED2D3F7C97583F215CB93FF762893FB30E573FA382453F6EDCB93F53C9713F937DBD3FA6FC813F92B5823FD7C1B23F01139F3FD5528A3FE7386D3F7668B03F",
      torch_tensor_32_torch.float32_1: "0x04000000DDF2B4BDF173D83E57D1DCBECE5D8FBD8BDD9F3C5FE1E63E0EFA7EBE2AB19C3EDEB4343EC44B5E3EADBB043E6870F13E8D552BBEE754D0BDF31B98BE1E0AE6BEB2FD92BEC0B7D43E9B2AAE3EC172C6BE198AD43D1D6CAABC24EAC13DFD18233E0EFB45BE2E36EC3E52EB0BBDDF2C033EBC780A3E40D9A1BE2D53E0BEAB36B5BD"
    }
  }
#-}
