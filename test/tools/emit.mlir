// --emit picks the stage to print; --mlir-print-debuginfo adds locations; -o and stdin.

// --emit=linalg prints the input as parsed: no pass runs.
// RUN: fuse-opt %S/Inputs/add.mlir --emit=linalg | filecheck %s --check-prefix=LINALG
// RUN: fuse-opt --emit=linalg < %S/Inputs/add.mlir | filecheck %s --check-prefix=LINALG
// RUN: cat %S/Inputs/add.mlir | fuse-opt - --emit=linalg | filecheck %s --check-prefix=LINALG
// LINALG-LABEL: func.func @add
// LINALG-COUNT-2: linalg.add
// LINALG-NOT: opfuse

// RUN: fuse-opt %S/Inputs/add.mlir --emit=linalg --mlir-print-debuginfo | filecheck %s --check-prefix=DEBUG
// DEBUG: linalg.add {{.*}} loc(#loc
// DEBUG: loc("{{.*}}add.mlir":4:8)
// RUN: fuse-opt --emit=linalg --mlir-print-debuginfo < %S/Inputs/add.mlir | filecheck %s --check-prefix=STDIN
// STDIN: loc("<stdin>":4:8)

// -o writes the output file instead of stdout.
// RUN: fuse-opt %S/Inputs/add.mlir --emit=linalg -o %t && filecheck %s --check-prefix=LINALG --input-file %t

// mlir-opt's single-dash spelling works too.
// RUN: fuse-opt %S/Inputs/add.mlir -emit=linalg -mlir-print-debuginfo | filecheck %s --check-prefix=DEBUG

// The report needs the fusion pipeline.
// RUN: not fuse-opt %S/Inputs/add.mlir --emit=linalg --opfuse-report=text 2>&1 | filecheck %s --check-prefix=NOREPORT
// NOREPORT: error: --opfuse-report needs the fusion pipeline

// --help lists every opfuse pass with its options and defaults.
// RUN: fuse-opt --help | filecheck %s --check-prefix=HELP
// HELP: --pass-pipeline
// HELP: opfuse passes and their options (defaults):
// HELP: opfuse-fuse-elementwise
// HELP-NEXT: delta=0.1 (float)
// HELP: opfuse-outline
// HELP: default pipeline:
// HELP-NEXT: builtin.module(opfuse-fold-unit-dims,opfuse-fuse-elementwise,
