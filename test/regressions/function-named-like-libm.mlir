// Regression: a public function named like a C library function that the CPU code calls
// (here @powf, which math.powf lowers to) captured those calls in the JIT and crashed
// (segfault). Lowered functions are now renamed opfuse_<name>.
// RUN: fuse-run %s --repeat 0 | filecheck %s
// CHECK: fuse-run: {{.*}} @powf on cpu
// CHECK: #0 {{.*}} ok
func.func @powf(%x: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %e = tensor.empty() : tensor<8x8xf32>
  %0 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<8x8xf32>) outs(%e : tensor<8x8xf32>) {
  ^bb0(%i: f32, %o: f32):
    %p = arith.constant 1.5 : f32
    %s = arith.mulf %i, %i : f32
    %r = math.powf %s, %p : f32
    linalg.yield %r : f32
  } -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}
