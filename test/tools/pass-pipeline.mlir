// --pass-pipeline takes upstream and opfuse passes in one textual pipeline.

// Upstream passes only: the fusion passes do not run.
// RUN: fuse-opt %s --pass-pipeline='builtin.module(func.func(cse))' | filecheck %s --check-prefix=CSE
// RUN: fuse-opt %s --pass-pipeline='builtin.module(canonicalize,func.func(cse))' | filecheck %s --check-prefix=CSE
// CSE-LABEL: func.func @twice
// CSE: linalg.add
// CSE-NOT: linalg.add
// CSE: linalg.mul ins(%[[S:.*]], %[[S]] :
// CSE-NOT: opfuse
// CSE: return

// An empty pipeline prints the input.
// RUN: fuse-opt %s --pass-pipeline='builtin.module()' | filecheck %s --check-prefix=EMPTY
// EMPTY-LABEL: func.func @twice
// EMPTY-COUNT-2: linalg.add

// Unknown upstream pass: MLIR's message, and the opfuse pass names.
// RUN: not fuse-opt %s --pass-pipeline='builtin.module(no-such-pass)' 2>&1 | filecheck %s --check-prefix=UNKNOWN
// RUN: %expect-exit 1 fuse-opt %s --pass-pipeline='builtin.module(no-such-pass)' 2>/dev/null
// UNKNOWN: error: invalid pass 'no-such-pass' in pipeline: 'no-such-pass' does not refer to a registered pass or pass pipeline (opfuse passes: opfuse-fold-unit-dims, opfuse-fuse-elementwise
// UNKNOWN-NOT: Traceback

// Bad upstream option: LLVM's option parser message is kept.
// RUN: not fuse-opt %s --pass-pipeline='builtin.module(canonicalize{max-iterations=x})' 2>&1 | filecheck %s --check-prefix=UPOPT
// UPOPT: error: invalid pass 'canonicalize{max-iterations=x}' in pipeline: {{.*}}max-iterations

// opfuse passes run on the whole module, never nested.
// RUN: not fuse-opt %s --pass-pipeline='builtin.module(func.func(opfuse-outline))' 2>&1 | filecheck %s --check-prefix=NESTED
// NESTED: error: opfuse pass 'opfuse-outline' runs on the whole module: put it at the top level

// Malformed text.
// RUN: not fuse-opt %s --pass-pipeline='builtin.module(cse' 2>&1 | filecheck %s --check-prefix=MALFORMED
// MALFORMED: error: {{.*}}pass pipeline

// Bad opfuse option inside a pipeline string.
// RUN: not fuse-opt %s --pass-pipeline='builtin.module(opfuse-fuse-elementwise{r-limit=lots})' 2>&1 | filecheck %s --check-prefix=OPT
// OPT: error: invalid value 'lots' for option 'r-limit' of opfuse-fuse-elementwise: expected int

// --pass-pipeline and individual pass flags do not mix (as in mlir-opt).
// RUN: not fuse-opt %s --pass-pipeline='builtin.module(cse)' --opfuse-outline 2>&1 | filecheck %s --check-prefix=MIX
// MIX: error: --pass-pipeline cannot be combined with individual pass flags (--opfuse-outline)

func.func @twice(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %e = tensor.empty() : tensor<4xf32>
  %0 = linalg.add ins(%a, %b : tensor<4xf32>, tensor<4xf32>) outs(%e : tensor<4xf32>) -> tensor<4xf32>
  %1 = linalg.add ins(%a, %b : tensor<4xf32>, tensor<4xf32>) outs(%e : tensor<4xf32>) -> tensor<4xf32>
  %2 = linalg.mul ins(%0, %1 : tensor<4xf32>, tensor<4xf32>) outs(%e : tensor<4xf32>) -> tensor<4xf32>
  return %2 : tensor<4xf32>
}
