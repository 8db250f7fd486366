"""The numpy interpreter that test_random_linalg.py uses as its reference, checked on its
own against hand-computed values (it must not share a mistake with the compiler)."""

from __future__ import annotations

import numpy as np

from linalg_interpreter import Interpreter


def _run(text: str, *args, tie: float = 1e-4):
    return Interpreter(text, tie=tie).run([np.asarray(a) for a in args])


def test_generic_with_broadcast_transpose_unit_dim_and_reduction():
    # out[j, 0] = init[j, 0] + sum_i x[i, j] * y[j] + j   (a (d0, 0) output, linalg.index)
    text = """
    func.func @f(%x: tensor<2x3xf32>, %y: tensor<3xf32>, %init: tensor<3x1xf32>) -> tensor<3x1xf32> {
      %r = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d1, d0)>, affine_map<(d0, d1) -> (d0)>,
                                            affine_map<(d0, d1) -> (d0, 0)>],
                           iterator_types = ["parallel", "reduction"]}
          ins(%x, %y : tensor<2x3xf32>, tensor<3xf32>) outs(%init : tensor<3x1xf32>) {
      ^bb0(%a: f32, %b: f32, %o: f32):
        %p = arith.mulf %a, %b : f32
        %s = arith.addf %o, %p : f32
        %j = linalg.index 0 : index
        %ji = arith.index_cast %j : index to i64
        %jf = arith.sitofp %ji : i64 to f32
        %i = linalg.index 1 : index
        %c0 = arith.constant 0 : index
        %first = arith.cmpi eq, %i, %c0 : index
        %add = arith.select %first, %jf, %jf : f32
        %zero = arith.constant 0.0 : f32
        %plus = arith.select %first, %add, %zero : f32
        %t = arith.addf %s, %plus : f32
        linalg.yield %t : f32
      } -> tensor<3x1xf32>
      return %r : tensor<3x1xf32>
    }"""
    x = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    y = np.array([1.0, 0.5, -1.0])
    init = np.array([[10.0], [20.0], [30.0]])
    (r,) = _run(text, x, y, init)
    want = init[:, 0] + (x * y).sum(0) + np.arange(3)
    np.testing.assert_array_equal(r.a, want.reshape(3, 1))
    assert not r.u.any()


def test_named_ops_and_tensor_ops():
    text = """
    func.func @f(%a: tensor<2x3xf32>, %b: tensor<4x3xf32>) -> (tensor<2x4xf32>, tensor<3x2xf32>, tensor<2xf32>, tensor<4x4xf32>, tensor<2x2xf32>) {
      %z = arith.constant 0.0 : f32
      %e = tensor.empty() : tensor<2x4xf32>
      %f = linalg.fill ins(%z : f32) outs(%e : tensor<2x4xf32>) -> tensor<2x4xf32>
      %mm = linalg.matmul indexing_maps = [affine_map<(m, n, k) -> (m, k)>, affine_map<(m, n, k) -> (n, k)>, affine_map<(m, n, k) -> (m, n)>]
          ins(%a, %b : tensor<2x3xf32>, tensor<4x3xf32>) outs(%f : tensor<2x4xf32>) -> tensor<2x4xf32>
      %et = tensor.empty() : tensor<3x2xf32>
      %t = linalg.transpose ins(%a : tensor<2x3xf32>) outs(%et : tensor<3x2xf32>) permutation = [1, 0]
      %m = arith.constant -100.0 : f32
      %er = tensor.empty() : tensor<2xf32>
      %fr = linalg.fill ins(%m : f32) outs(%er : tensor<2xf32>) -> tensor<2xf32>
      %red = linalg.reduce ins(%a : tensor<2x3xf32>) outs(%fr : tensor<2xf32>) dimensions = [1]
        (%in: f32, %acc: f32) {
          %x = arith.maximumf %in, %acc : f32
          linalg.yield %x : f32
        }
      %one = arith.constant 1.0 : f32
      %p = tensor.pad %b low[0, 0] high[0, 1] {
      ^bb0(%i: index, %j: index):
        tensor.yield %one : f32
      } : tensor<4x3xf32> to tensor<4x4xf32>
      %s = tensor.extract_slice %p[1, 1] [2, 2] [2, 2] : tensor<4x4xf32> to tensor<2x2xf32>
      return %mm, %t, %red, %p, %s : tensor<2x4xf32>, tensor<3x2xf32>, tensor<2xf32>, tensor<4x4xf32>, tensor<2x2xf32>
    }"""
    a = np.array([[1.0, -2.0, 3.0], [0.5, 4.0, -1.0]])
    b = np.arange(12.0).reshape(4, 3)
    mm, t, red, p, s = _run(text, a, b)
    np.testing.assert_array_equal(mm.a, a @ b.T)
    np.testing.assert_array_equal(t.a, a.T)
    np.testing.assert_array_equal(red.a, [3.0, 4.0])
    padded = np.concatenate([b, np.ones((4, 1))], axis=1)
    np.testing.assert_array_equal(p.a, padded)
    np.testing.assert_array_equal(s.a, padded[1:4:2, 1:4:2])


def test_integers_wrap_and_divide_toward_zero():
    text = """
    func.func @f(%x: tensor<4xi32>) -> tensor<4xi32> {
      %e = tensor.empty() : tensor<4xi32>
      %r = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
                           iterator_types = ["parallel"]} ins(%x : tensor<4xi32>) outs(%e : tensor<4xi32>) {
      ^bb0(%a: i32, %o: i32):
        %c3 = arith.constant 3 : i32
        %q = arith.divsi %a, %c3 : i32
        %m = arith.remsi %a, %c3 : i32
        %big = arith.constant 2147483647 : i32
        %w = arith.addi %big, %m : i32
        %t = arith.addi %q, %w : i32
        linalg.yield %t : i32
      } -> tensor<4xi32>
      return %r : tensor<4xi32>
    }"""
    x = np.array([-7, 7, -1, 2], np.int32)
    (r,) = _run(text, x)
    q = np.array([-2, 2, 0, 0])
    m = np.array([-1, 1, -1, 2])
    want = ((q + 2147483647 + m + 2**31) % 2**32 - 2**31).astype(np.int32)
    np.testing.assert_array_equal(r.a, want)


def test_near_ties_are_marked_uncertain():
    # select(x < 0.5, 1, 0): an element within the tie band of 0.5 is not compared
    text = """
    func.func @f(%x: tensor<3xf32>) -> tensor<3xf32> {
      %e = tensor.empty() : tensor<3xf32>
      %r = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
                           iterator_types = ["parallel"]} ins(%x : tensor<3xf32>) outs(%e : tensor<3xf32>) {
      ^bb0(%a: f32, %o: f32):
        %h = arith.constant 0.5 : f32
        %c = arith.cmpf olt, %a, %h : f32
        %one = arith.constant 1.0 : f32
        %zero = arith.constant 0.0 : f32
        %s = arith.select %c, %one, %zero : f32
        %t = arith.addf %s, %a : f32
        linalg.yield %t : f32
      } -> tensor<3xf32>
      return %r : tensor<3xf32>
    }"""
    (r,) = _run(text, np.array([0.1, 0.50000001, 0.9]), tie=1e-5)
    np.testing.assert_allclose(r.a, [1.1, 0.50000001, 0.9])
    assert r.u.tolist() == [False, True, False]
