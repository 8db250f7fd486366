// RUN: fuse-opt %s --emit=kernels | filecheck %s
// RUN: fuse-opt %s --emit=ptx | filecheck %s --check-prefix=PTX
// RUN: env OPFUSE_MATMUL=simt fuse-opt %s --emit=ptx | filecheck %s --check-prefix=SIMT

#id = affine_map<(d0, d1) -> (d0, d1)>
#col = affine_map<(d0, d1) -> (d1)>

// bf16 Linear + bias + ReLU: one tensor-core kernel (backends/gpu/emit/matmul_mma.py). Slabs of A
// and B go global -> shared with cp.async (the prologue fills the first stages, one commit
// per stage); each K step waits for its slab, takes one barrier, refills the oldest stage,
// then every warp loads fragments with ldmatrix (.trans for B, whose rows run along N)
// and issues mma.sync. The bias and the ReLU are applied to the f32 accumulator pairs,
// rounded to bf16 and stored two at a time.
// CHECK-LABEL: func.func @fusion_0_output(
// CHECK: gpu.launch
// CHECK: nvgpu.device_async_copy {{.*}}, 8 {bypassL1} : memref<8192xbf16> to memref<{{[0-9]+}}xbf16, 3>
// CHECK: nvvm.cp.async.commit.group
// CHECK: scf.for
// CHECK: nvvm.cp.async.wait.group
// CHECK-NEXT: gpu.barrier
// CHECK: nvgpu.ldmatrix {{.*}} {numTiles = 4 : i32, transpose = false} : memref<{{[0-9]+}}xbf16, 3> -> vector<4x2xbf16>
// CHECK: nvgpu.ldmatrix {{.*}} {numTiles = 4 : i32, transpose = true} : memref<{{[0-9]+}}xbf16, 3> -> vector<4x2xbf16>
// CHECK: nvvm.mma.sync A[{{.*}}] B[{{.*}}] C[{{.*}}] {{.*}}multiplicandAPtxType = #nvvm.mma_type<bf16>{{.*}}shape = #nvvm.shape<m = 16, n = 8, k = 16>
// CHECK: scf.yield
// CHECK: arith.maximumf {{.*}} : vector<2xf32>
// CHECK: arith.truncf {{.*}} : vector<2xf32> to vector<2xbf16>
// CHECK: vector.store {{.*}} : memref<24576xbf16>, vector<2xbf16>
// CHECK-NOT: func.func
// PTX: kernel fusion_0_output (entry fusion_0_output_kernel, emitter mma,
// PTX: cp.async.cg.shared.global
// PTX: cp.async.commit_group
// PTX: cp.async.wait_group
// PTX: bar.sync
// PTX: ldmatrix.sync.aligned.m8n8.x4.shared.b16
// PTX: ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16
// PTX: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
// PTX: st.global.b32
// SIMT: kernel fusion_0_output (entry fusion_0_output_kernel, emitter matmul, grid [3, 2, 1], block [16, 16, 1])
// SIMT-NOT: mma.sync
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
