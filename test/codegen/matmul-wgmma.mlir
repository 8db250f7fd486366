// RUN: env OPFUSE_MATMUL=wgmma fuse-opt %s --emit=kernels --target=sm_90a | filecheck %s
// RUN: env OPFUSE_MATMUL=wgmma fuse-opt %s --emit=ptx --target=sm_90a | filecheck %s --check-prefix=PTX
// RUN: env OPFUSE_MATMUL=wgmma fuse-opt %s --emit=ptx --target=sm_90 | filecheck %s --check-prefix=SM90

#id = affine_map<(d0, d1) -> (d0, d1)>
#col = affine_map<(d0, d1) -> (d1)>

// The bf16 Linear + bias + ReLU of matmul-mma.mlir with matmul=wgmma on sm_90a
// (backends/gpu/emit/matmul_wgmma.py): one warpgroup per 64 rows of the block tile. Slabs go global ->
// shared with cp.async into the core-matrix layout; each K step waits for its slab, fences
// the generic proxy (the copies) for wgmma's async proxy, takes one barrier, refills the
// stage whose wgmma group is done, then wgmma.fence, two mma_async (k16 each) reading A and
// B through descriptors (B with imm-trans-b: its rows run along N), one commit, and a wait
// that leaves this step's group in flight. The epilogue reads the accumulator struct after
// wait_group 0. On plain sm_90 the wgmma emitter declines and the kernel is mma.sync.
// CHECK-LABEL: func.func @fusion_0_output(
// CHECK: gpu.launch
// CHECK: memref.extract_aligned_pointer_as_index {{.*}} : memref<{{[0-9]+}}xbf16, 3> -> index
// CHECK: nvgpu.device_async_copy {{.*}}, 8 {bypassL1} : memref<8192xbf16> to memref<{{[0-9]+}}xbf16, 3>
// CHECK: nvvm.cp.async.commit.group
// CHECK: scf.for {{.*}} -> (!llvm.struct<(f32,
// CHECK: nvvm.cp.async.wait.group
// CHECK-NEXT: nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}
// CHECK-NEXT: gpu.barrier
// CHECK: nvvm.wgmma.fence.aligned
// CHECK: nvvm.wgmma.mma_async {{.*}} <m = 64, n = {{[0-9]+}}, k = 16>, D[<f32>, <one>], A[<bf16>, <one>, <row>], B[<bf16>, <one>, <row>]
// CHECK: nvvm.wgmma.mma_async
// CHECK: nvvm.wgmma.commit.group.sync.aligned
// CHECK-NEXT: nvvm.wgmma.wait.group.sync.aligned 1
// CHECK: scf.yield
// CHECK: nvvm.wgmma.wait.group.sync.aligned 0
// CHECK: llvm.extractvalue
// CHECK: arith.maximumf {{.*}} : vector<2xf32>
// CHECK: vector.store {{.*}} : memref<24576xbf16>, vector<2xbf16>
// CHECK-NOT: func.func
// PTX: kernel fusion_0_output (entry fusion_0_output_kernel, emitter wgmma,
// PTX: .target sm_90a
// PTX: cp.async.cg.shared.global
// PTX: cp.async.wait_group
// PTX-NEXT: fence.proxy.async.shared::cta
// PTX-NEXT: bar.sync
// PTX: wgmma.fence.sync.aligned
// PTX: wgmma.mma_async.sync.aligned.m64n{{[0-9]+}}k16.f32.bf16.bf16
// PTX: wgmma.commit_group.sync.aligned
// PTX: wgmma.wait_group.sync.aligned 1
// PTX: wgmma.wait_group.sync.aligned 0
// PTX-NOT: ldmatrix
// SM90: kernel fusion_0_output (entry fusion_0_output_kernel, emitter mma,
// SM90-NOT: wgmma
func.func @linear_relu(%x: tensor<128x64xbf16>, %w: tensor<64x192xbf16>, %b: tensor<192xf32>) -> tensor<128x192xbf16> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<128x192xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<128x192xf32>) -> tensor<128x192xf32>
  %mm = linalg.matmul ins(%x, %w : tensor<128x64xbf16>, tensor<64x192xbf16>) outs(%f : tensor<128x192xf32>) -> tensor<128x192xf32>
  %o = tensor.empty() : tensor<128x192xbf16>
  %y = linalg.generic {indexing_maps = [#id, #col, #id], iterator_types = ["parallel", "parallel"]}
      ins(%mm, %b : tensor<128x192xf32>, tensor<192xf32>) outs(%o : tensor<128x192xbf16>) {
  ^bb0(%i: f32, %j: f32, %out: bf16):
    %s = arith.addf %i, %j : f32
    %r = arith.maximumf %s, %zero : f32
    %t = arith.truncf %r : f32 to bf16
    linalg.yield %t : bf16
  } -> tensor<128x192xbf16>
  return %y : tensor<128x192xbf16>
}
