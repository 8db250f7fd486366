// Two public functions for fuse-run's --entry test (not a test itself): a bf16 one with
// two results, and an f16 one.
func.func @two_results(%x: tensor<4x8xbf16>, %y: tensor<4x8xbf16>) -> (tensor<4x8xbf16>, tensor<4x8xbf16>) {
  %e = tensor.empty() : tensor<4x8xbf16>
  %0 = linalg.add ins(%x, %y : tensor<4x8xbf16>, tensor<4x8xbf16>) outs(%e : tensor<4x8xbf16>) -> tensor<4x8xbf16>
  %1 = linalg.exp ins(%0 : tensor<4x8xbf16>) outs(%e : tensor<4x8xbf16>) -> tensor<4x8xbf16>
  %2 = linalg.mul ins(%1, %y : tensor<4x8xbf16>, tensor<4x8xbf16>) outs(%e : tensor<4x8xbf16>) -> tensor<4x8xbf16>
  return %1, %2 : tensor<4x8xbf16>, tensor<4x8xbf16>
}

func.func @half(%x: tensor<16xf16>) -> tensor<16xf16> {
  %e = tensor.empty() : tensor<16xf16>
  %0 = linalg.exp ins(%x : tensor<16xf16>) outs(%e : tensor<16xf16>) -> tensor<16xf16>
  %1 = linalg.mul ins(%0, %x : tensor<16xf16>, tensor<16xf16>) outs(%e : tensor<16xf16>) -> tensor<16xf16>
  return %1 : tensor<16xf16>
}
