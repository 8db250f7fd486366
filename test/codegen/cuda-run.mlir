// REQUIRES: cuda
// RUN: fuse-opt %s --emit=bundle -o %t.opfuse
// RUN: %PYTHON %S/Inputs/run_bundle_cuda.py %t.opfuse | filecheck %s

// On a GPU the bundle's kernels give the CPU library's results.
// CHECK: max abs difference cuda vs cpu: {{0\.0|[0-9.]+e-0[7-9]}}
func.func @gelu_like(%x: tensor<256x1024xf32>) -> tensor<256x1024xf32> {
  %e = tensor.empty() : tensor<256x1024xf32>
  %t = linalg.tanh ins(%x : tensor<256x1024xf32>) outs(%e : tensor<256x1024xf32>) -> tensor<256x1024xf32>
  %y = linalg.mul ins(%x, %t : tensor<256x1024xf32>, tensor<256x1024xf32>) outs(%e : tensor<256x1024xf32>) -> tensor<256x1024xf32>
  return %y : tensor<256x1024xf32>
}
