// fuse-opt reports bad input as `file:line:col: error: message` on stderr, exit code 1,
// and never a Python traceback.

// A parse error points at the offending token (this file is the bad input).
// RUN: not fuse-opt %s 2>&1 | filecheck %s --check-prefix=PARSE
// RUN: %expect-exit 1 fuse-opt %s 2>/dev/null
// PARSE: error: cannot parse {{.*}}errors.mlir
// PARSE-NEXT: {{.*}}errors.mlir:[[# @LINE + 4]]:23: error: use of undeclared SSA value name
// PARSE-NOT: Traceback

func.func @bad(%x: f32) -> f32 {
  %0 = arith.addf %x, %y : f32
  return %0 : f32
}

// RUN: not fuse-opt %t.does-not-exist.mlir 2>&1 | filecheck %s --check-prefix=MISSING
// RUN: %expect-exit 1 fuse-opt %t.does-not-exist.mlir 2>/dev/null
// MISSING: error: cannot read {{.*}}does-not-exist.mlir: No such file or directory
// MISSING-NOT: Traceback

// A bad option value names the option, the type it wants, and every valid option.
// RUN: not fuse-opt %S/Inputs/add.mlir --opfuse-fuse-elementwise="delta=abc" 2>&1 | filecheck %s --check-prefix=BADVALUE
// BADVALUE: error: invalid value 'abc' for option 'delta' of opfuse-fuse-elementwise: expected float; valid options: {{.*}}delta=
// BADVALUE-NOT: Traceback

// RUN: not fuse-opt %S/Inputs/add.mlir --opfuse-fuse-elementwise="no-such-option=1" 2>&1 | filecheck %s --check-prefix=BADKEY
// BADKEY: error: unknown option 'no-such-option' for opfuse-fuse-elementwise; valid options: {{.*}}delta=

// RUN: not fuse-opt %S/Inputs/add.mlir --emit=bogus 2>&1 | filecheck %s --check-prefix=EMIT
// EMIT: error: unknown stage 'bogus' for --emit (stages: linalg, fused{{.*}})

// RUN: not fuse-opt %S/Inputs/add.mlir --no-such-flag 2>&1 | filecheck %s --check-prefix=FLAG
// FLAG: error: unrecognized arguments: --no-such-flag

// RUN: not fuse-opt %S/Inputs/add.mlir --disable-pass=opfuse-nope 2>&1 | filecheck %s --check-prefix=DISABLE
// DISABLE: error: cannot disable opfuse-nope: not in the default pipeline (opfuse-fold-unit-dims, opfuse-fuse-elementwise{{.*}})

// RUN: not fuse-opt %S/Inputs/add.mlir --opfuse-report=xml 2>&1 | filecheck %s --check-prefix=REPORT
// REPORT: error: {{.*}}invalid choice: 'xml'

// Nothing is written to -o when the run fails.
// RUN: rm -f %t.out && not fuse-opt %s -o %t.out 2>/dev/null && not test -e %t.out
