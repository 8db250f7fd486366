// torch-mlir output of nn.Conv2d(8, 8, 3, padding=1, groups=4), x: 1x8x16x16 (see export.py in this folder: the wheel, the
// call; printed as is, parsed unchanged by the MLIR 22.1.8 bindings).
module {
  func.func @main(%arg0: tensor<1x8x16x16xf32>) -> tensor<1x8x16x16xf32> {
    %cst = arith.constant 0.000000e+00 : f32
    %cst_0 = arith.constant dense_resource<torch_tensor_8_2_3_3_torch.float32> : tensor<8x2x3x3xf32>
    %cst_1 = arith.constant dense_resource<torch_tensor_8_torch.float32> : tensor<8xf32>
    %padded = tensor.pad %arg0 low[0, 0, 1, 1] high[0, 0, 1, 1] {
    ^bb0(%arg1: index, %arg2: index, %arg3: index, %arg4: index):
      tensor.yield %cst : f32
    } : tensor<1x8x16x16xf32> to tensor<1x8x18x18xf32>
    %0 = tensor.empty() : tensor<1x8x16x16xf32>
    %broadcasted = linalg.broadcast ins(%cst_1 : tensor<8xf32>) outs(%0 : tensor<1x8x16x16xf32>) dimensions = [0, 2, 3] 
    %expanded = tensor.expand_shape %padded [[0], [1, 2], [3], [4]] output_shape [1, 4, 2, 18, 18] : tensor<1x8x18x18xf32> into tensor<1x4x2x18x18xf32>
    %expanded_2 = tensor.expand_shape %cst_0 [[0, 1], [2], [3], [4]] output_shape [4, 2, 2, 3, 3] : tensor<8x2x3x3xf32> into tensor<4x2x2x3x3xf32>
    %expanded_3 = tensor.expand_shape %broadcasted [[0], [1, 2], [3], [4]] output_shape [1, 4, 2, 16, 16] : tensor<1x8x16x16xf32> into tensor<1x4x2x16x16xf32>
    %1 = linalg.conv_2d_ngchw_gfchw {dilations = dense<1> : vector<2xi64>, strides = dense<1> : vector<2xi64>} ins(%expanded, %expanded_2 : tensor<1x4x2x18x18xf32>, tensor<4x2x2x3x3xf32>) outs(%expanded_3 : tensor<1x4x2x16x16xf32>) -> tensor<1x4x2x16x16xf32>
    %collapsed = tensor.collapse_shape %1 [[0], [1, 2], [3], [4]] : tensor<1x4x2x16x16xf32> into tensor<1x8x16x16xf32>
    return %collapsed : tensor<1x8x16x16xf32>
  }
}

{-#
  dialect_resources: {
    builtin: {
      torch_tensor_8_2_3_3_torch.float32: "0x040000002E4CE7BABE79013E42A646BE27A031BEC9EBB9BDC771813DE50699BB015F3F3E7D5AABBC74777F3D3EE291BD7AC53DBD029566BE0BD91FBED4FCC6BD880D0F3CE4D5BE3D2BD2103E94A023BEB234D2BDDF54AF3DF56B483EDFAF46BDA39C343EBF9C1BBD4750CC3C818B5A3ED6E65FBED9F117BE3B6A74BDDE29BCBDD388503EAE711CBE0936DEBD8D9F28BE2B0C62BE1EE40CBEC9784F3ED265D73DD5F5E93D62184B3C4F7BF7BD4A56233D115B61BEE0652EBE11DBF8BD5A48183E94830D3E4915D6BD4C570BBC225D1A3E6EF16F3E0F95BF3D6F6C023DF7D3213EE11C0EBE40E7333D86203BBE5C4827BE435DF9BDC06ADA3D5221C23D3DF80EBE25D5913DD97F043EAEB5F3BC8A72133C39B25F3DCABB153E69C0673E3DFF39BED1E6B0BD8AB6BD3D5BFA473E5008523E00F7543ECA22403DB7E151BE36A0B13CDDFE16BE85EF60BE1D72563E0F85373E31C370BEE6B3343D2FA322BD93DF1EBDB4F7DCBDDDA1B93D36F50EBED8F5B03D511DF43D3AC82C3E657EB43DB2E16EBEA4911CBE4907F13D31114A3DC7473CBEB2FA0ABEF40E633ED0A1223E2F7AD2BD55FC72BD11EB65BEB7D28ABBF4C135BE892C3ABEDAC754BC9CF4103D0FB0C5BD93370F3E60E012BE86005B3E4367253EB6884BBE314870BD8A402E3CB5DB0C3D08FA643DAA6EBD3DB851673C3888EBBDBE6AE43D028667BE1F0E0FBE75AD71BD7523EBBDF6DEA8BDBBD245BEEB5C4DBD475E4E3DB93C1DBEAD2E46BCF2C62C3E857EC6BC27A7D63B0493A6BCE862433D3577193E63A0643ECB46193E4D26653ED8A48BBC",
      torch_tensor_8_torch.float32: "0x040000006ED158BE81D8E4BDBA57243E0345C8BAEFEEEFBDD2F438BE5DE061BE86B54BBE"
    }
  }
#-}
