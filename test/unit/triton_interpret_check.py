"""Run by test_triton_peer.py in a child process with ``TRITON_INTERPRET=1`` (Triton reads
it when the kernels are decorated): the Triton peer's kernels executed by Triton's CPU
interpreter on small f32 problems with tails, against float64 torch references. Prints
one ``name max_abs_error`` line per kernel."""

import math

import torch

from bench.peers import triton_kernels as tk


def main() -> None:
    torch.manual_seed(0)
    M, N, K = 70, 40, 50  # none a multiple of the blocks
    x, w, b, r = torch.randn(M, K), torch.randn(K, N) / 8, torch.randn(N), torch.randn(M, N)
    blocks = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=16, GROUP_M=2, PRECISION="ieee")
    grid = (-(-M // 32) * -(-N // 32),)
    out = torch.empty(M, N)
    tk.linear[grid](x, w, b, r, out, M, N, K, K, N, N, N, BIAS=True, GELU=True,
                    RESIDUAL=True, **blocks)
    h = x.double() @ w.double() + b.double()
    ref = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
    print("linear", (out.double() - ref - r.double()).abs().max().item())

    out = torch.empty(M, N)
    tk.linear[grid](x, w, b, r, out, M, N, K, K, N, N, N, BIAS=False, GELU=False,
                    RESIDUAL=False, **blocks)
    print("matmul", (out.double() - x.double() @ w.double()).abs().max().item())

    wg, wu = torch.randn(K, N) / 8, torch.randn(K, N) / 8
    out = torch.empty(M, N)
    tk.swiglu[grid](x, wg, wu, out, M, N, K, K, N, N, **blocks)
    g, u = x.double() @ wg.double(), x.double() @ wu.double()
    print("swiglu", (out.double() - g * torch.sigmoid(g) * u).abs().max().item())

    # G6's layout: Q/K/V column blocks of one packed [B*T, 3 H D], O written [B, T, H, D]
    B, T, H, D = 2, 37, 2, 16
    ld = 3 * H * D
    qkv, o = torch.randn(B * T, ld), torch.empty(B, T, H, D)
    s_in = (T * ld, D, ld)
    tk.attention[(-(-T // 16), B * H)](
        qkv, qkv[:, H * D:], qkv[:, 2 * H * D:], o, 1 / math.sqrt(D), T, H,
        *s_in, *s_in, *s_in, T * H * D, D, H * D,
        HEAD_DIM=D, BLOCK_M=16, BLOCK_N=16, PRECISION="ieee")
    q, k, v = (qkv.double().view(B, T, 3, H, D)[:, :, i].transpose(1, 2) for i in range(3))
    ref = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D), -1) @ v
    print("attention", (o.double().transpose(1, 2) - ref).abs().max().item())


if __name__ == "__main__":
    main()
