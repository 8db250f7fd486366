// --matmul and --allow-tf32 reach the GPU backend from the command line (they were only
// reachable through $OPFUSE_MATMUL before): the emitter of each matmul kernel follows them,
// per kernel too, and a bad mode fails before any work.

// RUN: fuse-opt %s --emit=ptx | filecheck %s --check-prefix=AUTO
// AUTO: kernel fusion_0_output ({{.*}}emitter matmul,
// RUN: fuse-opt %s --emit=ptx --matmul=mma --allow-tf32 | filecheck %s --check-prefix=MMA
// MMA: kernel fusion_0_output ({{.*}}emitter mma,
// RUN: fuse-opt %s --emit=ptx --allow-tf32 --matmul=fusion_0_output=simt,mma | filecheck %s --check-prefix=PER
// PER: kernel fusion_0_output ({{.*}}emitter matmul,
// RUN: env OPFUSE_MATMUL=simt fuse-opt %s --emit=ptx --matmul=mma --allow-tf32 | filecheck %s --check-prefix=MMA
// RUN: not fuse-opt %s --emit=fused --matmul=fast 2>&1 | filecheck %s --check-prefix=BAD
// BAD: error: matmul mode 'fast' (in 'fast'): expected auto, mma, wgmma, simt, or <kernel>=<mode>
// The CPU backend's stage is one of the driver's stages too.
// RUN: fuse-opt %s --emit=cpu | filecheck %s --check-prefix=CPU
// CPU: llvm.func @opfuse_fusion_0_output(
// CPU: llvm.func @opfuse_mm({{.*}}llvm.emit_c_interface
// RUN: fuse-opt --help | filecheck %s --check-prefix=HELP
// HELP: --matmul MODE
// HELP: --allow-tf32
// HELP: cpu      the LLVM-dialect module of the CPU backend

func.func @mm(%a: tensor<64x64xf32>, %b: tensor<64x64xf32>) -> tensor<64x64xf32> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<64x64xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<64x64xf32>) -> tensor<64x64xf32>
  %m = linalg.matmul ins(%a, %b : tensor<64x64xf32>, tensor<64x64xf32>) outs(%f : tensor<64x64xf32>) -> tensor<64x64xf32>
  return %m : tensor<64x64xf32>
}
