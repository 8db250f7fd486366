// Issue #11's kernel counts, read from the JSON report: G5 (attention) is one attention
// kernel; G6 (encoder layer) is 7: LN1, the Q/K/V projections as one horizontal kernel,
// attention, o_proj + residual, LN2, FFN1 + GELU, FFN2 + residual; G7 (RMSNorm + SwiGLU)
// is 3: RMSNorm, W1 and W3 with the SwiGLU product as one horizontal kernel, W2.
// RUN: fuse-opt %S/../../examples/g5_attention.mlir --opfuse-report=json | python %S/Inputs/kernel_kinds.py | filecheck %s --check-prefix=G5
// G5: kernels 15 -> 1
// G5-NEXT: attention attn.qk
// G5-NOT: {{.}}
// RUN: fuse-opt %S/../../examples/g6_encoder_layer.mlir --opfuse-report=json | python %S/Inputs/kernel_kinds.py | filecheck %s --check-prefix=G6
// G6: kernels 69 -> 7
// G6-NEXT: input ln1.
// G6-NEXT: horizontal q_proj k_proj v_proj
// G6-NEXT: attention attn.qk
// G6-NEXT: output o_proj
// G6-NEXT: input ln2.
// G6-NEXT: output ffn1
// G6-NEXT: output ffn2
// G6-NOT: {{.}}
// RUN: fuse-opt %S/../../examples/g7_rmsnorm_swiglu.mlir --opfuse-report=json | python %S/Inputs/kernel_kinds.py | filecheck %s --check-prefix=G7
// G7: kernels 13 -> 3
// G7-NEXT: input rms_norm.
// G7-NEXT: horizontal gate_proj up_proj
// G7-NEXT: output down_proj
// G7-NOT: {{.}}
