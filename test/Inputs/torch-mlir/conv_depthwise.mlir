// torch-mlir output of nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8), x: 1x8x16x16 (see export.py in this folder: the wheel, the
// call; printed as is, parsed unchanged by the MLIR 22.1.8 bindings).
module {
  func.func @main(%arg0: tensor<1x8x16x16xf32>) -> tensor<1x8x8x8xf32> {
    %cst = arith.constant 0.000000e+00 : f32
    %cst_0 = arith.constant dense_resource<torch_tensor_8_1_3_3_torch.float32> : tensor<8x1x3x3xf32>
    %cst_1 = arith.constant dense_resource<torch_tensor_8_torch.float32> : tensor<8xf32>
    %padded = tensor.pad %arg0 low[0, 0, 1, 1] high[0, 0, 1, 1] {
    ^bb0(%arg1: index, %arg2: index, %arg3: index, %arg4: index):
      tensor.yield %cst : f32
    } : tensor<1x8x16x16xf32> to tensor<1x8x18x18xf32>
    %0 = tensor.empty() : tensor<1x8x8x8xf32>
    %broadcasted = linalg.broadcast ins(%cst_1 : tensor<8xf32>) outs(%0 : tensor<1x8x8x8xf32>) dimensions = [0, 2, 3] 
    %collapsed = tensor.collapse_shape %cst_0 [[0, 1], [2], [3]] : tensor<8x1x3x3xf32> into tensor<8x3x3xf32>
    %1 = linalg.depthwise_conv_2d_nchw_chw {dilations = dense<1> : vector<2xi64>, strides = dense<2> : vector<2xi64>} ins(%padded, %collapsed : tensor<1x8x18x18xf32>, tensor<8x3x3xf32>) outs(%broadcasted : tensor<1x8x8x8xf32>) -> tensor<1x8x8x8xf32>
    return %1 : tensor<1x8x8x8xf32>
  }
}

{-#
  dialect_resources: {
    builtin: {
      torch_tensor_8_1_3_3_torch.float32: "0x04000000568D23BB281B373E64778CBE56337BBE4E7703BEE60FB73DAB69D8BBDF51873E9654F2BC66A4B43D904FCEBD4B3086BDD00BA3BE180F62BE9BB40CBEAB4E4A3CEBF0063ECBCE4C3E666767BE53A314BECBF4F73D34B88D3E307E8CBD7B6C7F3EAB115CBDB678103DDC889A3E8A529EBEDEE156BED6D3ACBD3E0D05BEC674933ECE3E5DBE80201DBE23786EBEFAD69FBE064047BE6AB4923E284F183E566F253E2B9C8F3CF8FE2EBE56FE663DBF599FBECEA276BEB3F72FBE335C573E8821483E306117BED60E45BCAB4D5A3E57AAA93E1878073E6072383DFEDB643E56FA48BEF66B7E3D9E5184BECB926CBEC35330BEB3711A3E5045093E8E304ABE0B3DCE3DE8613B3E2B542CBDAB85503C562D9E3D56C1533E86DFA33E0F8583BE3B2DFABD",
      torch_tensor_8_torch.float32: "0x04000000BB25063EE0678D3EF083943EC296963E50DC873DA66894BE6B33FB3C3B8A55BE"
    }
  }
#-}
