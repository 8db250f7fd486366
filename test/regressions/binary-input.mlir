// Regression (issue #10): a file of NUL bytes passed fuse-opt with exit 0 (MLIR's lexer
// stops at a NUL byte, so it saw an empty module), and a non-UTF-8 file made opfuse.compile raise
// UnicodeDecodeError. Both are located errors, exit 1.
// RUN: %PYTHON -c "open(r'%t.nul.mlir', 'wb').write(bytes(64))"
// RUN: %expect-exit 1 fuse-opt %t.nul.mlir 2>&1 | filecheck %s --check-prefix=NUL
// NUL: nul.mlir:1:1: error: NUL byte in the input
// RUN: %PYTHON -c "open(r'%t.latin1.mlir', 'wb').write(b'func.func @f() {\n  \xe9\n}\n')"
// RUN: %expect-exit 1 fuse-opt %t.latin1.mlir 2>&1 | filecheck %s --check-prefix=UTF8
// RUN: %expect-exit 1 fuse-run %t.latin1.mlir 2>&1 | filecheck %s --check-prefix=UTF8
// UTF8: latin1.mlir:2:3: error: byte 0xe9 is not UTF-8
// RUN: %PYTHON -c "open(r'%t.deep.mlir', 'w').write('func.func @f() {\n' + '[' * 200000 + '\n}\n')"
// RUN: %expect-exit 1 fuse-opt %t.deep.mlir 2>&1 | filecheck %s --check-prefix=DEEP
// DEEP: deep.mlir:2:1000: error: brackets nest deeper than 1000 levels
