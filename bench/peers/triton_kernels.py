"""The Triton kernels of the Triton peer (bench/peers/triton_peer.py compiles them for
sm_90 and sm_80 without a GPU; imported only when triton is installed).

Written the way a Triton user writes them (the tutorials' structure: 03 matrix
multiplication, 06 fused attention), for the matmul work of the G graphs:

* :func:`linear`: ``act(x @ w + bias) (+ residual)`` — G1's two Linear+GELU, G6's packed
  QKV projection (one matmul over ``[wq | wk | wv]``), its o_proj + residual, FFN1 + GELU and
  FFN2 + residual. Grouped tile order (``GROUP_M``), masked tails, the epilogue on the
  accumulator in registers.
* :func:`swiglu`: ``silu(x @ w_gate) * (x @ w_up)`` — G7's gate and up projections as one
  kernel with two accumulators (what a user writes instead of two matmuls).
* :func:`attention`: a FlashAttention-2 forward (online softmax in base 2, one query block
  per program, the key/value loop software-pipelined by Triton), strided so that G6 reads
  Q/K/V straight from the packed QKV output and writes O in the merged-heads layout.

``PRECISION`` is ``tl.dot``'s ``input_precision`` for f32 operands: ``"ieee"`` (FFMA,
bit-for-bit IEEE products) or ``"tf32"`` (tensor cores); bf16 operands ignore it.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _gelu_tanh(x):
    # 0.5 x (1 + tanh(u)) == x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3)
    u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    return x * tl.sigmoid(2.0 * u)


@triton.jit
def _tile(M, N, K, stride_xm, stride_wk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
          BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's rows and columns of the output, GROUP_M row blocks at a time so that
    neighbouring programs share their operand tiles in L2 (tutorial 03), the K offsets, and
    the offsets of its first x and w tiles (rows/columns past the end read row/column 0:
    their results are masked at the store)."""
    pid = tl.program_id(0)
    per_group = GROUP_M * tl.cdiv(N, BLOCK_N)
    first_m = (pid // per_group) * GROUP_M
    group_m = tl.minimum(tl.cdiv(M, BLOCK_M) - first_m, GROUP_M)
    rm = (first_m + (pid % per_group) % group_m) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = ((pid % per_group) // group_m) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    x_off = (rm % M)[:, None] * stride_xm + rk[None, :]
    w_off = rk[:, None] * stride_wk + (rn % N)[None, :]
    return rm, rn, rk, x_off, w_off


@triton.jit
def _store(out, y, rm, rn, M, N, stride_om):
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(out + rm[:, None] * stride_om + rn[None, :], y.to(out.dtype.element_ty), mask=mask)


@triton.jit
def linear(x, w, bias, res, out, M, N, K, stride_xm, stride_wk, stride_om, stride_rm,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
           GROUP_M: tl.constexpr, BIAS: tl.constexpr, GELU: tl.constexpr,
           RESIDUAL: tl.constexpr, PRECISION: tl.constexpr):
    rm, rn, rk, x_off, w_off = _tile(M, N, K, stride_xm, stride_wk, BLOCK_M, BLOCK_N, BLOCK_K,
                                     GROUP_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(x + x_off, mask=rk[None, :] < k_left, other=0.0)
        b = tl.load(w + w_off, mask=rk[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        x_off += BLOCK_K
        w_off += BLOCK_K * stride_wk
    if BIAS:
        acc += tl.load(bias + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    if GELU:
        acc = _gelu_tanh(acc)
    if RESIDUAL:
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        acc += tl.load(res + rm[:, None] * stride_rm + rn[None, :], mask=mask).to(tl.float32)
    _store(out, acc, rm, rn, M, N, stride_om)


@triton.jit
def swiglu(x, w_gate, w_up, out, M, N, K, stride_xm, stride_wk, stride_om,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
           GROUP_M: tl.constexpr, PRECISION: tl.constexpr):
    rm, rn, rk, x_off, w_off = _tile(M, N, K, stride_xm, stride_wk, BLOCK_M, BLOCK_N, BLOCK_K,
                                     GROUP_M)
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(x + x_off, mask=rk[None, :] < k_left, other=0.0)
        g = tl.load(w_gate + w_off, mask=rk[:, None] < k_left, other=0.0)
        u = tl.load(w_up + w_off, mask=rk[:, None] < k_left, other=0.0)
        gate = tl.dot(a, g, gate, input_precision=PRECISION)
        up = tl.dot(a, u, up, input_precision=PRECISION)
        x_off += BLOCK_K
        w_off += BLOCK_K * stride_wk
    _store(out, gate * tl.sigmoid(gate) * up, rm, rn, M, N, stride_om)


@triton.jit
def attention(q, k, v, o, sm_scale, T, H,
              stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
              stride_vb, stride_vh, stride_vt, stride_ob, stride_oh, stride_ot,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              PRECISION: tl.constexpr):
    """softmax(Q Kᵀ · sm_scale) V for one block of BLOCK_M queries of one (batch, head)."""
    b = tl.program_id(1) // H
    h = tl.program_id(1) % H
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    rd = tl.arange(0, HEAD_DIM)
    q_rows = q + b * stride_qb + h * stride_qh + rm[:, None] * stride_qt + rd[None, :]
    q_tile = tl.load(q_rows, mask=rm[:, None] < T, other=0.0)
    kt_cols = k + b * stride_kb + h * stride_kh + rn[None, :] * stride_kt + rd[:, None]
    v_rows = v + b * stride_vb + h * stride_vh + rn[:, None] * stride_vt + rd[None, :]
    scale = sm_scale * 1.4426950408889634  # exp(x) == exp2(x * log2(e))
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    for start in range(0, T, BLOCK_N):
        keys = start + rn
        kt = tl.load(kt_cols + start * stride_kt, mask=keys[None, :] < T, other=0.0)
        s = tl.dot(q_tile, kt, input_precision=PRECISION) * scale
        s = tl.where(keys[None, :] < T, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        vt = tl.load(v_rows + start * stride_vt, mask=keys[:, None] < T, other=0.0)
        acc = tl.dot(p.to(vt.dtype), vt, acc * alpha[:, None], input_precision=PRECISION)
        m_i = m_new
    acc = acc / l_i[:, None]
    o_rows = o + b * stride_ob + h * stride_oh + rm[:, None] * stride_ot + rd[None, :]
    tl.store(o_rows, acc.to(o.dtype.element_ty), mask=rm[:, None] < T)


KERNELS = {"linear": linear, "swiglu": swiglu, "attention": attention}
