// --split-input-file: every chunk runs on its own; a bad chunk is reported with its
// line in this file, the others are still printed, and the exit code is 1.

// RUN: not fuse-opt %s --split-input-file --pass-pipeline='builtin.module(func.func(cse))' 2>/dev/null | filecheck %s
// RUN: not fuse-opt %s --split-input-file --pass-pipeline='builtin.module(func.func(cse))' 2>&1 >/dev/null | filecheck %s --check-prefix=ERR
// RUN: %expect-exit 1 fuse-opt %s --split-input-file --pass-pipeline='builtin.module(func.func(cse))' >/dev/null 2>&1

// CHECK-LABEL: func.func @first
// CHECK: arith.addi
// CHECK-NOT: arith.addi
// CHECK: return
// CHECK-NEXT: }
// CHECK-NEXT: }
// CHECK-NEXT: // -----
// CHECK-NOT: @broken
// CHECK-LABEL: func.func @third
func.func @first(%x: i32) -> i32 {
  %0 = arith.addi %x, %x : i32
  %1 = arith.addi %x, %x : i32
  %2 = arith.muli %0, %1 : i32
  return %2 : i32
}

// -----

// ERR: {{.*}}split-input-file.mlir:[[# @LINE + 2]]:23: error: use of undeclared SSA value name
func.func @broken(%x: i32) -> i32 {
  %0 = arith.addi %x, %y : i32
  return %0 : i32
}

// -----

func.func @third(%x: i32) -> i32 {
  return %x : i32
}
