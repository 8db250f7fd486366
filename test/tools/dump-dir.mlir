// --dump-dir writes the input, the IR after every step, the pipeline and the ledger into
// a fresh folder per run (<input>-<pid>-<n>), so runs never collide.

// RUN: rm -rf %t && fuse-opt %s --pass-pipeline='builtin.module(canonicalize,func.func(cse))' --dump-dir %t -o /dev/null
// RUN: ls %t | filecheck %s --check-prefix=FOLDER
// FOLDER: dump-dir-{{[0-9]+}}-0

// RUN: ls %t/* | filecheck %s --check-prefix=FILES
// FILES: 00-input.mlir
// FILES-NEXT: 01-canonicalize+func.func.mlir
// FILES-NEXT: ledger.json
// FILES-NEXT: pipeline.txt

// RUN: cat %t/*/pipeline.txt | filecheck %s --check-prefix=PIPELINE
// PIPELINE: builtin.module(canonicalize,func.func(cse))

// Dumps carry locations, so a dumped stage can be fed back to fuse-opt.
// RUN: cat %t/*/01-*.mlir | filecheck %s --check-prefix=STEP
// STEP-LABEL: func.func @dumped
// STEP: linalg.add {{.*}}loc(
// STEP-NOT: linalg.add
// RUN: fuse-opt %t/*/01-*.mlir --pass-pipeline='builtin.module()' -o /dev/null

// RUN: cat %t/*/ledger.json | filecheck %s --check-prefix=LEDGER
// LEDGER: []

// A second run into the same folder gets its own subfolder.
// RUN: fuse-opt %s --pass-pipeline='builtin.module(canonicalize)' --dump-dir %t -o /dev/null
// RUN: ls %t | wc -l | filecheck %s --check-prefix=TWO
// TWO: 2

// Options are printed in canonical form (non-default only, declaration order).
// RUN: rm -rf %t.opts && fuse-opt %s --pass-pipeline='builtin.module(opfuse-fuse-elementwise{r-limit=32 delta=0.1 target=sm_90},cse)' --dump-dir %t.opts -o /dev/null
// RUN: cat %t.opts/*/pipeline.txt | filecheck %s --check-prefix=CANONICAL
// CANONICAL: builtin.module(opfuse-fuse-elementwise{r-limit=32},cse)

// OPFUSE_DUMP_DIR is the default for --dump-dir.
// RUN: rm -rf %t.env && env OPFUSE_DUMP_DIR=%t.env fuse-opt %s --pass-pipeline='builtin.module(canonicalize,func.func(cse))' -o /dev/null
// RUN: ls %t.env/* | filecheck %s --check-prefix=FILES

func.func @dumped(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %e = tensor.empty() : tensor<4xf32>
  %0 = linalg.add ins(%a, %b : tensor<4xf32>, tensor<4xf32>) outs(%e : tensor<4xf32>) -> tensor<4xf32>
  %1 = linalg.add ins(%a, %b : tensor<4xf32>, tensor<4xf32>) outs(%e : tensor<4xf32>) -> tensor<4xf32>
  %2 = linalg.mul ins(%0, %1 : tensor<4xf32>, tensor<4xf32>) outs(%e : tensor<4xf32>) -> tensor<4xf32>
  return %2 : tensor<4xf32>
}
