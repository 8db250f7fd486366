// fuse-run compiles this file with and without fusion, runs both on the same inputs,
// compares the outputs and times them. Exit codes: 0 ok, 1 user error, 3 mismatch.

func.func @chain(%x: tensor<32x64xf32>, %b: tensor<32x64xf32>) -> tensor<32x64xf32> {
  %e = tensor.empty() : tensor<32x64xf32>
  %0 = linalg.add ins(%x, %b : tensor<32x64xf32>, tensor<32x64xf32>) outs(%e : tensor<32x64xf32>) -> tensor<32x64xf32>
  %1 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%0 : tensor<32x64xf32>) outs(%e : tensor<32x64xf32>) {
  ^bb0(%in: f32, %out: f32):
    %t = math.tanh %in : f32
    linalg.yield %t : f32
  } -> tensor<32x64xf32>
  %2 = linalg.mul ins(%1, %x : tensor<32x64xf32>, tensor<32x64xf32>) outs(%e : tensor<32x64xf32>) -> tensor<32x64xf32>
  return %2 : tensor<32x64xf32>
}

// The summary: the table (unfused, fused, change), the timing note, one check per output.
// RUN: fuse-run %s --repeat 2 | filecheck %s
// CHECK: fuse-run: {{.*}}fuse-run.mlir @chain on cpu
// CHECK-NEXT: inputs: random uniform [-1, 1), seed 0
// CHECK-EMPTY:
// CHECK-NEXT: {{ +}}unfused {{ +}}fused {{ +}}change
// CHECK-NEXT: kernels {{ +}}3 {{ +}}1 {{ +}}-2
// CHECK-NEXT: device bytes {{ +}}{{[0-9.]+}} KiB ({{[0-9]+}} B) {{ +}}{{[0-9.]+}} KiB ({{[0-9]+}} B) {{ +}}-{{[0-9.]+}}%
// CHECK-NEXT: flops {{ +}}{{[0-9.]+}} kFLOP {{ +}}{{[0-9.]+}} kFLOP {{ +}}0%
// CHECK-NEXT: compile + JIT {{ +}}{{[0-9.]+}} {{m?s}} {{ +}}{{[0-9.]+}} {{m?s}}
// CHECK-NEXT: time median {{ +}}{{[0-9.]+}} {{[mu]?s}} {{ +}}{{[0-9.]+}} {{[mu]?s}} {{ +}}{{[0-9.]+}}x {{faster|\(slower\)}}
// CHECK-NEXT: time min {{ +}}{{[0-9.]+}} {{[mu]?s}} {{ +}}{{[0-9.]+}} {{[mu]?s}} {{ +}}{{[0-9.]+}}x
// CHECK-NEXT: timing: 2 calls of each, fused and unfused interleaved, after the checked run
// CHECK-EMPTY:
// CHECK-NEXT: output {{ +}}type {{ +}}max abs {{ +}}max rel {{ +}}rtol {{ +}}atol {{ +}}check
// CHECK-NEXT: #0 {{ +}}tensor<32x64xf32> {{ +}}{{[-+.e0-9]+}} {{ +}}{{[-+.e0-9]+}} {{ +}}1e-05 {{ +}}1e-06 {{ +}}ok

// --repeat 0 checks only; stdin works like a file.
// RUN: fuse-run - --repeat 0 --warmup 3 < %s | filecheck %s --check-prefix=STDIN
// STDIN: fuse-run: <stdin> @chain on cpu
// STDIN-NOT: time median
// STDIN: timing: skipped (--repeat 0)
// STDIN: #0 {{.*}} ok

// --json: every figure in one JSON object, the fusion report embedded with --report=json.
// RUN: fuse-run %s --repeat 1 --seed 7 --json --report=json | filecheck %s --check-prefix=JSON
// JSON: {
// JSON-DAG: "entry": "chain",
// JSON-DAG: "backend": "cpu",
// JSON-DAG: "seed": 7,
// JSON-DAG: "kernels": 3,
// JSON-DAG: "kernels": 1,
// JSON-DAG: "median_s":
// JSON-DAG: "speedup": {
// JSON-DAG: "mismatches": 0,
// JSON-DAG: "report": {
// JSON-DAG: "decisions": [
// JSON-DAG: "ok": true

// --report=text prints the fusion report (opfuse.report.render) before the summary.
// RUN: fuse-run %s --repeat 0 --report=text | filecheck %s --check-prefix=REPORT
// REPORT: kernels: 3 -> 1 (2 launches saved)
// REPORT: decision {{.*}}fuse-run.mlir:{{[0-9]+}}:{{[0-9]+}}: fused
// REPORT: fuse-run: {{.*}} @chain on cpu

// Pass flags reach the fused program only: without elementwise fusion, or with a saving
// threshold above what fusing saves, nothing fuses.
// RUN: fuse-run %s --repeat 0 --disable-pass=opfuse-fuse-elementwise | filecheck %s --check-prefix=DISABLED
// RUN: fuse-run %s --repeat 0 --opfuse-fuse-elementwise="delta=0.9" --opfuse-outline | filecheck %s --check-prefix=DISABLED
// DISABLED: kernels {{ +}}3 {{ +}}3 {{ +}}0{{$}}

// --save-outputs writes in<i>.npy and out<i>.npy; --inputs DIR (or a file list) replays them.
// RUN: rm -rf %t && fuse-run %s --repeat 0 --seed 5 --save-outputs %t/first > /dev/null
// RUN: ls %t/first | filecheck %s --check-prefix=SAVED
// RUN: fuse-run %s --repeat 0 --inputs %t/first | filecheck %s --check-prefix=DIR
// DIR: inputs: {{.*}}first{{[/\\]}}in0.npy, {{.*}}first{{[/\\]}}in1.npy
// DIR: #0 {{.*}} ok
// SAVED: in0.npy
// SAVED-NEXT: in1.npy
// SAVED-NEXT: out0.npy
// RUN: fuse-run %s --repeat 0 --inputs %t/first/in0.npy,%t/first/in1.npy --save-outputs %t/again | filecheck %s --check-prefix=REPLAY
// REPLAY: inputs: {{.*}}first{{[/\\]}}in0.npy, {{.*}}first{{[/\\]}}in1.npy
// RUN: %PYTHON -c "import numpy as np, sys; a, b = (np.load(sys.argv[i] + '/out0.npy') for i in (1, 2)); sys.exit(0 if a.shape == (32, 64) and (a == b).all() else 1)" %t/first %t/again

// --inputs errors name the file and the argument; exit code 1, no traceback.
// RUN: %expect-exit 1 fuse-run %s --inputs %t/first/in0.npy 2>&1 | filecheck %s --check-prefix=COUNT
// COUNT: error: --inputs: @chain takes 2 input(s) (tensor<32x64xf32>, tensor<32x64xf32>), got 1 file(s)
// COUNT-NOT: Traceback
// RUN: %PYTHON -c "import numpy as np, sys; np.save(sys.argv[1], np.zeros((64, 32), np.float32)); np.save(sys.argv[2], np.zeros((32, 64)))" %t/shape.npy %t/f64.npy
// RUN: not fuse-run %s --inputs %t/first/in0.npy,%t/shape.npy 2>&1 | filecheck %s --check-prefix=SHAPE
// SHAPE: error: --inputs: {{.*}}shape.npy (input #1, tensor<32x64xf32>): shape (64, 32), expected (32, 64)
// RUN: not fuse-run %s --inputs %t/f64.npy,%t/first/in1.npy 2>&1 | filecheck %s --check-prefix=DTYPE
// DTYPE: error: --inputs: {{.*}}f64.npy (input #0, tensor<32x64xf32>): dtype float64, expected float32
// RUN: not fuse-run %s --inputs %s,%t/first/in1.npy 2>&1 | filecheck %s --check-prefix=NOTNPY
// NOTNPY: error: --inputs: {{.*}}fuse-run.mlir is not a .npy file (no .npy header)
// RUN: not fuse-run %s --inputs %t/missing.npy,%t/first/in1.npy 2>&1 | filecheck %s --check-prefix=MISSING
// MISSING: error: --inputs: cannot read {{.*}}missing.npy: No such file or directory

// Fused and unfused disagreeing beyond the tolerance: the summary, then exit code 3.
// Here the fused side expands tanh into exp arithmetic (math-expand-ops), which rounds
// differently from the CPU backend's tanh: within the default f32 tolerance, not within 0,0.
// RUN: %expect-exit 3 fuse-run %S/Inputs/tanh.mlir --repeat 0 --tolerance 0,0 --pass-pipeline='builtin.module(func.func(math-expand-ops{ops=tanh}),opfuse-fuse-elementwise,opfuse-outline)' 2>&1 | filecheck %s --check-prefix=MISMATCH
// MISMATCH: #0 {{ +}}tensor<64x64xf32> {{.*}} 0 {{ +}}0 {{ +}}MISMATCH ({{[0-9]+}} of 4096)
// MISMATCH: error: fused and unfused outputs differ beyond the tolerance
// MISMATCH-NEXT: output #0 (tensor<64x64xf32>): {{[0-9]+}} of 4096 elements differ beyond rtol 0, atol 0; max abs {{.*}}; worst at [{{[0-9]+}}, {{[0-9]+}}]: fused {{.*}}, unfused {{.*}}
// MISMATCH-NOT: Traceback

// Several public functions: --entry picks one (bf16 outputs compare at the bf16 tolerance).
// RUN: not fuse-run %S/Inputs/fuse-run-two-funcs.mlir 2>&1 | filecheck %s --check-prefix=NOENTRY
// NOENTRY: error: cannot choose an entry function: several public functions (@two_results, @half); name one with --entry NAME
// RUN: fuse-run %S/Inputs/fuse-run-two-funcs.mlir --entry two_results --repeat 0 | filecheck %s --check-prefix=BF16
// BF16: fuse-run: {{.*}}fuse-run-two-funcs.mlir @two_results on cpu
// BF16: kernels {{ +}}3 {{ +}}1 {{ +}}-2
// BF16: #0 {{ +}}tensor<4x8xbf16> {{.*}} 0.02 {{ +}}0.01 {{ +}}ok
// BF16-NEXT: #1 {{ +}}tensor<4x8xbf16> {{.*}} 0.02 {{ +}}0.01 {{ +}}ok
// RUN: not fuse-run %S/Inputs/fuse-run-two-funcs.mlir --entry nope 2>&1 | filecheck %s --check-prefix=NOFUNC
// NOFUNC: error: no function @nope in the module (have: @two_results, @half)

// Flag errors: exit code 1 and one line.
// RUN: not fuse-run %s --backend cuda 2>&1 | filecheck %s --check-prefix=CUDA
// CUDA: error: --backend cuda: cuda backend not available
// RUN: not fuse-run %s --tolerance 1e-3 2>&1 | filecheck %s --check-prefix=TOL
// TOL: error: argument --tolerance: expected RTOL,ATOL (two numbers), got '1e-3' (see fuse-run --help)
// RUN: not fuse-run %s --inputs %t/first --seed 1 2>&1 | filecheck %s --check-prefix=SEED
// SEED: error: --seed has no effect with --inputs
// RUN: %expect-exit 1 fuse-run %t/does-not-exist.mlir
// RUN: %expect-exit 1 fuse-run %s --disable-pass=opfuse-nope

// --help documents the exit codes and the default tolerances.
// RUN: fuse-run --help | filecheck %s --check-prefix=HELP
// HELP: usage: fuse-run
// HELP: --inputs A.npy,B.npy
// HELP: --save-outputs DIR
// HELP: exit codes:
// HELP: 3  fused and unfused outputs differ beyond the tolerance
// HELP: f32   rtol 1e-05, atol 1e-06
