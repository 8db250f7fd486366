// REQUIRES: ptxas
// RUN: fuse-opt %s --emit=cubin | filecheck %s
// RUN: fuse-opt %s --emit=cubin --target=sm_80 | filecheck %s

// ptxas -v figures of every kernel: registers, no spills.
// CHECK: fusion_0_loop: entry=fusion_0_loop_kernel emitter=loop grid=[8, 1, 1] block=[256, 1, 1] registers={{[0-9]+}} spill_stores=0 spill_loads=0 smem=0 cubin_bytes={{[1-9][0-9]*}}
func.func @exp(%x: tensor<8192xf32>) -> tensor<8192xf32> {
  %e = tensor.empty() : tensor<8192xf32>
  %y = linalg.exp ins(%x : tensor<8192xf32>) outs(%e : tensor<8192xf32>) -> tensor<8192xf32>
  return %y : tensor<8192xf32>
}
