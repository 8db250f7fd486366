// The text report, line by line: totals, the T_saved estimate with T_launch and B_mem
// named, one line per kernel (W, Q, AI, registers, bytes saved), one per decision with
// the fusion's step (what --fusion-fuel counts). Figures come from the cost model.

// G2 (elementwise chain of 6 ops): one kernel, 5 fusions.
// RUN: fuse-opt %S/../../examples/g2_elementwise_chain.mlir --opfuse-report=text | filecheck %s --check-prefix=G2
// G2: kernels: 6 -> 1 (5 launches saved)
// G2-NEXT: bytes: 768.1 MiB -> 128.1 MiB (-83.3%)
// G2-NEXT: flops: 101 MFLOP -> 101 MFLOP
// G2-NEXT: ops: 6 in 1 function; decisions: 5 (5 fused, 0 refused)
// G2-NEXT: t_saved: {{[0-9.]+}} us = 5 launches x T_launch 3 us + 640.0 MiB / B_mem 4.8 TB/s (sm_90)
// G2-NEXT: kernel fusion_0_loop: kind=loop members=6 flops=101 MFLOP bytes=128.1 MiB ai=0.75 regs={{[0-9]+}} saved=640.0 MiB
// G2-NEXT: decision add: fused #1 [fuse-elementwise] mul -> add: saving 0.50 > delta 0.10, R_fused {{[0-9]+}} < R_limit 128
// G2-NEXT: decision tanh: fused #2 [fuse-elementwise] add -> tanh:
// G2-NEXT: decision mul_1: fused #3 [fuse-elementwise] tanh -> mul_1:
// G2-NEXT: decision add_1: fused #4 [fuse-elementwise] mul_1 -> add_1:
// G2-NEXT: decision relu: fused #5 [fuse-elementwise] add_1 -> relu:
// G2-NOT: decision

// The target prices the saving: sm_80's launch and bandwidth figures.
// RUN: fuse-opt %S/../../examples/g2_elementwise_chain.mlir --opfuse-fuse-elementwise="target=sm_80" --opfuse-outline --opfuse-report=text | filecheck %s --check-prefix=SM80
// SM80: t_saved: {{[0-9.]+}} us = 5 launches x T_launch 4 us + 640.0 MiB / B_mem 2 TB/s (sm_80)

// G1 (the seed MLP): each bias + GELU chain is the epilogue of its matmul.
// RUN: fuse-opt %S/../../examples/g1_mlp.mlir --opfuse-report=text | filecheck %s --check-prefix=G1
// G1: kernels: 20 -> 2 (18 launches saved)
// G1: ops: 20 in 1 function; decisions: 19 (18 fused, 1 refused)
// G1-NEXT: t_saved: {{.*}} = 18 launches x T_launch 3 us + 80.0 MiB / B_mem 4.8 TB/s (sm_90)
// G1-NEXT: kernel fusion_0_output: kind=output members=10 {{.*}} saved=40.0 MiB
// G1-NEXT: kernel fusion_1_output: kind=output members=10 {{.*}} saved=40.0 MiB
// G1-NEXT: decision gelu1.pow: fused #1 [fuse-elementwise] fc1.bias -> gelu1.pow:

// G5 (attention): one kernel; its bytes in the seed's terms: Q_S (S written by Q·Kᵀ and
// read by the softmax, P written by it and read by P·V: 4 x 64 MiB) stays on chip.
// RUN: fuse-opt %S/../../examples/g5_attention.mlir --opfuse-report=text | filecheck %s --check-prefix=G5
// G5: kernels: 15 -> 1 (14 launches saved)
// G5: kernel fusion_0_attention: kind=attention members=15 {{.*}} bytes=32.0 MiB
// G5-NEXT: attention: Q_fused = Q_QK + Q_PV = 32.0 MiB (Q, K, V, masks read, O written); Q_S = 256.0 MiB saved (S and P stay on chip; Q_unfused 288.0 MiB)
// G5: decision attn.pv: fused #{{[0-9]+}} [fuse-attention] attn.qk -> attn.pv: saving 0.89 > delta 0.10, R_fused {{[0-9]+}} < R_limit 128 (Q_S 268435456 B stays on chip)

// G6 (encoder layer): a producer duplicated into three kernels is one fusion, one step.
// RUN: fuse-opt %S/../../examples/g6_encoder_layer.mlir --opfuse-report=text | filecheck %s --check-prefix=G6
// G6: kernels: 69 -> 7 (62 launches saved)
// G6: ops: 69 in 1 function; decisions: {{[0-9]+}} ({{[0-9]+}} fused, {{[0-9]+}} refused)
// G6: kernel fusion_0_input: kind=input members=13
// G6: decision ln1.mean.sum: fused #[[DUP:[0-9]+]] (duplicate) [fuse-producer-consumer] tokens -> ln1.mean.sum: recompute moves
// G6-NEXT: decision ln1.sub: fused #[[DUP]] (duplicate) [fuse-producer-consumer] tokens -> ln1.sub:
// G6-NEXT: decision residual1: fused #[[DUP]] (duplicate) [fuse-producer-consumer] tokens -> residual1:
