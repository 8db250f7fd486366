// RUN: fuse-opt %s --split-input-file --opfuse-fold-unit-dims | filecheck %s
// torch-mlir's own softmax and LayerNorm (test/Inputs/torch-mlir, real output): one kernel
// each with the default pipeline; without this pass LayerNorm is 7 (4 when only this pass
// is left out: opfuse-fuse-recompute computes some of the 32x1 glue again where it is
// read). Softmax is one kernel even without it: the 32 -> 32x1 reshape of the max saves
// 0.02 of the bytes but a launch, so the guard takes it into the subtraction, and the
// reduction pass then takes the rest; that kernel has no GPU row emitter, though (its
// reduction writes 32x1, not the row index): the fold is what makes it a row kernel.
// RUN: fuse-opt %S/../Inputs/torch-mlir/softmax.mlir --opfuse-report=text | filecheck %s --check-prefix=SOFTMAX
// RUN: fuse-opt %S/../Inputs/torch-mlir/softmax.mlir --disable-pass=opfuse-fold-unit-dims --disable-pass=opfuse-fuse-recompute --opfuse-report=text | filecheck %s --check-prefix=SOFTMAX-OFF
// RUN: fuse-opt %S/../Inputs/torch-mlir/softmax.mlir --disable-pass=opfuse-fold-unit-dims --opfuse-report=text | filecheck %s --check-prefix=SOFTMAX-RECOMPUTE
// RUN: fuse-opt %S/../Inputs/torch-mlir/layernorm.mlir --opfuse-report=text | filecheck %s --check-prefix=LN
// RUN: fuse-opt %S/../Inputs/torch-mlir/layernorm.mlir --disable-pass=opfuse-fold-unit-dims --disable-pass=opfuse-fuse-recompute --opfuse-report=text | filecheck %s --check-prefix=LN-OFF
// RUN: fuse-opt %S/../Inputs/torch-mlir/layernorm.mlir --disable-pass=opfuse-fold-unit-dims --opfuse-report=text | filecheck %s --check-prefix=LN-RECOMPUTE
// SOFTMAX: kernels: 6 -> 1
// SOFTMAX: kernel fusion_0_input: kind=input members=5
// The ledger still names the producer's ops where they were written.
// SOFTMAX: decision {{.*}}softmax.mlir:{{[0-9]+}}:{{[0-9]+}}: fused #{{[0-9]+}} [fuse-reduction] linalg.generic@{{.*}}softmax.mlir:{{[0-9]+}}:{{[0-9]+}} -> linalg.generic@
// SOFTMAX-OFF: kernels: 6 -> 1
// SOFTMAX-OFF: fused #{{[0-9]+}} [fuse-producer-consumer] tensor.expand_shape{{.*}}: saving 0.02 <= delta 0.10 in bytes, time saving 0.50 > delta with 1 launch saved
// LN: kernels: 16 -> 1
// LN: kernel fusion_0_input: kind=input members=16
// LN-OFF: kernels: 16 -> 7
// SOFTMAX-RECOMPUTE: kernels: 6 -> 1
// LN-RECOMPUTE: kernels: 16 -> 4

#id = affine_map<(d0, d1) -> (d0, d1)>
#keep = affine_map<(d0, d1) -> (d0, 0)>

// A sum that keeps the reduced dim (torch-mlir's form): the reduction writes 32, the 32x1
// result is a reshape of it, and the consumer reads the 32 values directly.
// CHECK-LABEL: func.func @keepdim_sum
// CHECK: %[[SUM:.*]] = linalg.generic {indexing_maps = [#{{.*}}, #{{.*}}], iterator_types = ["parallel", "reduction"]} ins(%{{.*}} : tensor<32x64xf32>) outs(%{{.*}} : tensor<32xf32>)
// CHECK: linalg.generic {{.*}} ins(%{{.*}}, %[[SUM]] : tensor<32x64xf32>, tensor<32xf32>)
// CHECK-NOT: tensor<32x1xf32>
// CHECK: return
func.func @keepdim_sum(%x: tensor<32x64xf32>) -> tensor<32x64xf32> {
  %zero = arith.constant 0.0 : f32
  %e1 = tensor.empty() : tensor<32x1xf32>
  %init = linalg.fill ins(%zero : f32) outs(%e1 : tensor<32x1xf32>) -> tensor<32x1xf32>
  %sum = linalg.generic {indexing_maps = [#id, #keep], iterator_types = ["parallel", "reduction"]}
      ins(%x : tensor<32x64xf32>) outs(%init : tensor<32x1xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %s = arith.addf %a, %acc : f32
    linalg.yield %s : f32
  } -> tensor<32x1xf32>
  %e = tensor.empty() : tensor<32x64xf32>
  %d = linalg.generic {indexing_maps = [#id, #keep, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x, %sum : tensor<32x64xf32>, tensor<32x1xf32>) outs(%e : tensor<32x64xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %q = arith.divf %a, %b : f32
    linalg.yield %q : f32
  } -> tensor<32x64xf32>
  return %d : tensor<32x64xf32>
}

// -----

#id = affine_map<(d0, d1) -> (d0, d1)>

// No unit dim: the function is left as it is (the payload's constant stays in the body,
// where the upstream pass would have hoisted it).
// CHECK-LABEL: func.func @no_unit_dims
// CHECK: ^bb0
// CHECK-NEXT: arith.constant 1.500000e+00 : f32
func.func @no_unit_dims(%x: tensor<32x64xf32>) -> tensor<32x64xf32> {
  %e = tensor.empty() : tensor<32x64xf32>
  %y = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<32x64xf32>) outs(%e : tensor<32x64xf32>) {
  ^bb0(%a: f32, %o: f32):
    %c = arith.constant 1.5 : f32
    %m = arith.mulf %a, %c : f32
    linalg.yield %m : f32
  } -> tensor<32x64xf32>
  return %y : tensor<32x64xf32>
}

// -----

// The reshapes the pass adds are named after the op they were made for (a ledger entry
// between them then reads "neg.collapse_shape -> neg", not "neg -> neg").
// RUN: fuse-opt %s --split-input-file --opfuse-fold-unit-dims --mlir-print-debuginfo | filecheck %s --check-prefix=LOC
// LOC-LABEL: func.func @named
// LOC: tensor.collapse_shape {{.*}} loc(#[[C:loc[0-9]*]])
// LOC: } -> tensor<6xf32> loc(#[[N:loc[0-9]*]])
// LOC: tensor.expand_shape {{.*}} loc(#[[E:loc[0-9]*]])
// LOC-DAG: #[[C]] = loc("neg.collapse_shape")
// LOC-DAG: #[[N]] = loc("neg")
// LOC-DAG: #[[E]] = loc("neg.expand_shape")
func.func @named(%x: tensor<6x1xf32>) -> tensor<6x1xf32> {
  %e = tensor.empty() : tensor<6x1xf32>
  %y = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<6x1xf32>) outs(%e : tensor<6x1xf32>) {
  ^bb0(%a: f32, %o: f32):
    %n = arith.negf %a : f32
    linalg.yield %n : f32
  } -> tensor<6x1xf32> loc("neg")
  return %y : tensor<6x1xf32>
}
