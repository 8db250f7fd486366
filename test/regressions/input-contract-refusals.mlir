// Regression (issue #10): IR opfuse accepted but could not handle failed late (exit 2,
// a RecursionError, a TypeError, SIGSEGV at run time). The input contract refuses each
// right after parsing, at its location, with the reason, exit 1; the other chunks are
// still processed.
// RUN: %expect-exit 1 fuse-opt %s --split-input-file 2>&1 | filecheck %s
// CHECK-NOT: Traceback
// CHECK-NOT: internal error
// Deep nesting (a RecursionError, exit 2): 100 nested scf.execute_region, generated.
// RUN: %PYTHON -c "p = chr(37); n = 100; t = 'tensor<4xf32>'; open(r'%t.deep.mlir', 'w').write(f'func.func @deep({p}x: {t}) -> {t} {{\n' + ''.join(f'{p}r{i} = scf.execute_region -> {t} {{\n' for i in range(n)) + f'scf.yield {p}x : {t}\n' + ''.join('}\n' + (f'scf.yield {p}r{i} : {t}\n' if i else '') for i in reversed(range(n))) + f'return {p}r0 : {t}\n}}\n')"
// RUN: %expect-exit 1 fuse-opt %t.deep.mlir 2>&1 | filecheck %s --check-prefix=DEEP
// RUN: %expect-exit 1 fuse-run %t.deep.mlir 2>&1 | filecheck %s --check-prefix=DEEP
// DEEP: deep.mlir:{{[0-9]+}}:1: error: 'scf.yield' is nested 65 regions deep (at most 64)

func.func @loop(%x: tensor<4xf32>) -> tensor<4xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  // CHECK: input-contract-refusals.mlir:[[# @LINE + 1]]:8: error: 'scf.for' is control flow
  %r = scf.for %i = %c0 to %c4 step %c1 iter_args(%acc = %x) -> (tensor<4xf32>) {
    scf.yield %acc : tensor<4xf32>
  }
  return %r : tensor<4xf32>
}

// -----

func.func @branch(%x: tensor<4xf32>, %y: tensor<4xf32>) -> tensor<4xf32> {
  %t = arith.constant true
  // CHECK: input-contract-refusals.mlir:[[# @LINE + 1]]:8: error: 'scf.if' is control flow
  %r = scf.if %t -> (tensor<4xf32>) {
    scf.yield %x : tensor<4xf32>
  } else {
    scf.yield %y : tensor<4xf32>
  }
  return %r : tensor<4xf32>
}

// -----

func.func @generate() -> tensor<4xf32> {
  // CHECK: input-contract-refusals.mlir:[[# @LINE + 1]]:8: error: 'tensor.generate' builds a tensor from a body opfuse cannot analyse
  %r = tensor.generate {
  ^bb0(%i: index):
    %c = arith.constant 1.0 : f32
    tensor.yield %c : f32
  } : tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

// CHECK: input-contract-refusals.mlir:[[# @LINE + 1]]:1: error: @blocks has 2 blocks: opfuse takes functions of one block
func.func @blocks(%x: tensor<4xf32>) -> tensor<4xf32> {
  cf.br ^bb1(%x : tensor<4xf32>)
^bb1(%y: tensor<4xf32>):
  return %y : tensor<4xf32>
}

// -----

// A recursive entry crashed the JIT code at run time (stack overflow, SIGSEGV).
// CHECK: input-contract-refusals.mlir:[[# @LINE + 1]]:1: error: @main calls itself (directly or through other functions): recursion is not supported
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = call @main(%x) : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// A dimension that does not fit int64 is a parse error...
// CHECK: input-contract-refusals.mlir:[[# @LINE + 1]]:32: error: invalid dimension
func.func @overflow(%x: tensor<99999999999999999999xf32>) -> tensor<4xf32> {
  %e = tensor.empty() : tensor<4xf32>
  return %e : tensor<4xf32>
}

// -----

// ... one that fits but is 2**40 or more is refused (byte counts would overflow int64).
// CHECK: input-contract-refusals.mlir:[[# @LINE + 1]]:1: error: a dimension of 2**40 or more is not supported: argument 0 of @huge has type tensor<1099511627776x8xf32>
func.func @huge(%x: tensor<1099511627776x8xf32>) -> tensor<8xf32> {
  %e = tensor.empty() : tensor<8xf32>
  return %e : tensor<8xf32>
}

// -----

// A fused kernel that still materializes a 256 GiB broadcast crashed (SIGSEGV).
#b = affine_map<(d0, d1) -> (d1)>
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @broadcast_then_sum(%x: tensor<4xf32>) -> tensor<4xf32> {
  // CHECK: input-contract-refusals.mlir:[[# @LINE + 1]]:8: error: 256 GiB tensor over the size limit of 16 GiB (set OPFUSE_MAX_TENSOR_BYTES or --max-tensor-bytes to raise it): 'tensor.empty' produces tensor<17179869184x4xf32>
  %e = tensor.empty() : tensor<17179869184x4xf32>
  %bc = linalg.generic {indexing_maps = [#b, #id], iterator_types = ["parallel", "parallel"]} ins(%x : tensor<4xf32>) outs(%e : tensor<17179869184x4xf32>) {
  ^bb0(%a: f32, %o: f32):
    linalg.yield %a : f32
  } -> tensor<17179869184x4xf32>
  %z = arith.constant 0.0 : f32
  %e2 = tensor.empty() : tensor<4xf32>
  %f = linalg.fill ins(%z : f32) outs(%e2 : tensor<4xf32>) -> tensor<4xf32>
  %s = linalg.generic {indexing_maps = [#id, #b], iterator_types = ["reduction", "parallel"]} ins(%bc : tensor<17179869184x4xf32>) outs(%f : tensor<4xf32>) {
  ^bb0(%a: f32, %o: f32):
    %t = arith.addf %a, %o : f32
    linalg.yield %t : f32
  } -> tensor<4xf32>
  return %s : tensor<4xf32>
}

// -----

// CHECK: input-contract-refusals.mlir:[[# @LINE + 1]]:1: error: element type complex<f32> is not supported
func.func @complex(%x: tensor<4xcomplex<f32>>) -> tensor<4xcomplex<f32>> {
  return %x : tensor<4xcomplex<f32>>
}

// -----

func.func @buffers(%x: tensor<4xf32>) -> tensor<4xf32> {
  // CHECK: input-contract-refusals.mlir:[[# @LINE + 1]]:8: error: 'memref.alloc' works on memrefs: opfuse takes linalg on tensors and bufferizes itself
  %m = memref.alloc() : memref<4xf32>
  return %x : tensor<4xf32>
}

// -----

// CHECK: input-contract-refusals.mlir:[[# @LINE + 1]]:1: error: argument 0 of @mask has type tensor<4xi1>: public functions take and return booleans as i8
func.func @mask(%m: tensor<4xi1>) -> tensor<4xf32> {
  %e = tensor.empty() : tensor<4xf32>
  return %e : tensor<4xf32>
}

// -----

// Calls must stay inside the module.
func.func private @elsewhere(tensor<4xf32>) -> tensor<4xf32>
func.func @caller(%x: tensor<4xf32>) -> tensor<4xf32> {
  // CHECK: input-contract-refusals.mlir:[[# @LINE + 1]]:8: error: call of @elsewhere, which is not defined in the module
  %0 = call @elsewhere(%x) : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// A well-formed chunk after the refused ones still fuses.
// CHECK-LABEL: func.func @fine
func.func @fine(%x: tensor<8x4xf32>) -> tensor<8x4xf32> {
  %e = tensor.empty() : tensor<8x4xf32>
  %0 = linalg.exp ins(%x : tensor<8x4xf32>) outs(%e : tensor<8x4xf32>) -> tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}
