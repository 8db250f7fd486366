// Regression (issue #10): a file without `module {` whose ops are followed by a resource
// section (`{-# dialect_resources ... #-}`, how dense_resource weights are printed) did not
// parse: the `module {` opfuse adds around bare ops also closed around the section. The
// `}` now goes in front of it (its column on that line is given back in diagnostics:
// test_contract.py::test_bare_file_with_a_resource_section).
// RUN: fuse-opt %s | filecheck %s --check-prefix=OPT
// RUN: fuse-run %s | filecheck %s --check-prefix=JIT
// OPT: @fusion_0_loop
// OPT: dense_resource<w4> : tensor<4xf32>
// OPT: dialect_resources
// OPT: w4: "0x040000000000803F000000400000404000008040"
// JIT: kernels{{ +}}1{{ +}}1
// JIT: #0{{ +}}tensor<4xf32>{{.*}}ok
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %w = arith.constant dense_resource<w4> : tensor<4xf32>
  %e = tensor.empty() : tensor<4xf32>
  %y = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>], iterator_types = ["parallel"]} ins(%x, %w : tensor<4xf32>, tensor<4xf32>) outs(%e : tensor<4xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %m = arith.mulf %a, %b : f32
    linalg.yield %m : f32
  } -> tensor<4xf32>
  return %y : tensor<4xf32>
}
{-#
  dialect_resources: {
    builtin: {
      w4: "0x040000000000803F000000400000404000008040"
    }
  }
#-}
