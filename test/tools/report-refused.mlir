// Refused candidates in the report: the binding reason with its numbers, and the
// threshold that would let the pair fuse ("would fuse with ..."), on several graphs.

// G1 with a saving threshold above what the first bias-to-GELU merge saves: refused by
// delta, and the report says which delta would accept it (the time saving, launch
// included, which is above the saving in bytes).
// RUN: fuse-opt %S/../../examples/g1_mlp.mlir --opfuse-fuse-elementwise="delta=0.45" --opfuse-outline --opfuse-report=text | filecheck %s --check-prefix=DELTA
// DELTA: decisions: {{[0-9]+}} ({{[0-9]+}} fused, {{[1-9][0-9]*}} refused)
// DELTA: decision gelu1.pow: not fused [fuse-elementwise] fc1.bias -> gelu1.pow: saving 0.25 <= delta 0.45 (time saving 0.44 with 1 launch saved) (would fuse with delta < 0.4436)

// G1 with a register limit under the fused kernel's estimate: refused by R, and the
// limit that would accept it is one more than R_fused.
// RUN: fuse-opt %S/../../examples/g1_mlp.mlir --opfuse-fuse-elementwise="r-limit=24" --opfuse-outline --opfuse-report=text | filecheck %s --check-prefix=RLIMIT
// RLIMIT: decision gelu1.pow: not fused [fuse-elementwise] fc1.bias -> gelu1.pow: R_fused [[R:[0-9]+]] >= R_limit 24 (would fuse with R_limit >= {{[0-9]+}})

// G3 (softmax) with the reduction's consumer fusion switched off: structural refusals
// carry no threshold.
// RUN: fuse-opt %S/../../examples/g3_softmax.mlir --opfuse-fuse-elementwise --opfuse-fuse-reduction="fuse-consumers=0" --opfuse-outline --opfuse-report=text | filecheck %s --check-prefix=SOFTMAX
// SOFTMAX: kernels: 5 -> 3 (2 launches saved)
// SOFTMAX: decision softmax.div: not fused [fuse-elementwise] softmax.exp -> softmax.div: would create a cycle through softmax.sum{{$}}
// SOFTMAX: decision softmax.sub: not fused [fuse-reduction] softmax.max -> softmax.sub: consumer fusion is off (fuse-consumers=0){{$}}
// SOFTMAX: decision softmax.div: not fused [fuse-reduction] softmax.sum -> softmax.div: consumer fusion is off (fuse-consumers=0){{$}}

// G6 (encoder layer) under the default pipeline: what stays apart, and why.
// RUN: fuse-opt %S/../../examples/g6_encoder_layer.mlir --opfuse-report=text | filecheck %s --check-prefix=G6
// G6: decision ln1.sub: not fused [fuse-elementwise] ln1.mean.mul -> ln1.sub: iteration spaces differ: 2048 vs 2048x512{{$}}
// G6: decision ln1.mul_1: not fused [fuse-elementwise] ln1.mul -> ln1.mul_1: would create a cycle through ln1.mean_1.mul{{$}}
// G6: decision attn.softmax.sub: not fused [fuse-elementwise] attn.scale -> attn.softmax.sub: would create a cycle through attn.softmax.max{{$}}

// G2 with fusion fuel: the candidates after the budget are refused, and the fuel that
// would apply the next one is named.
// RUN: fuse-opt %S/../../examples/g2_elementwise_chain.mlir --fusion-fuel=2 --opfuse-report=text | filecheck %s --check-prefix=FUEL
// FUEL: kernels: 6 -> 4 (2 launches saved)
// FUEL: decision add: fused #1 [fuse-elementwise] mul -> add:
// FUEL-NEXT: decision tanh: fused #2 [fuse-elementwise] add -> tanh:
// FUEL-NEXT: decision mul_1: not fused [fuse-elementwise] tanh -> mul_1: fusion fuel exhausted (2 applied) (would fuse with fusion-fuel >= 3)

// The same reasons in the JSON report: refused entries keep the guard's numbers.
// RUN: fuse-opt %S/../../examples/g1_mlp.mlir --opfuse-fuse-elementwise="delta=0.45" --opfuse-outline --opfuse-report=json | filecheck %s --check-prefix=JSON
// JSON: "fused": false,
// JSON-NEXT: "location": "gelu1.pow",
// JSON-NEXT: "numbers": {
// JSON: "delta": 0.45,
// JSON: "saving": 0.25
// JSON: "t_saving": 0.4436
// JSON: "reason": "saving 0.25 <= delta 0.45 (time saving 0.44 with 1 launch saved)",
// JSON-NEXT: "step": null,
// JSON-NEXT: "would_fuse_with": "delta < 0.4436"

// And in the HTML report: one row per refused candidate, threshold or "structural".
// RUN: fuse-opt %S/../../examples/g1_mlp.mlir --opfuse-fuse-elementwise="delta=0.45" --opfuse-outline --opfuse-report=html | filecheck %s --check-prefix=HTML
// HTML: <h2>Refused candidates ({{[1-9][0-9]*}})</h2>
// HTML: <tr class="refused"><td>fuse-elementwise</td><td>fc1.bias → gelu1.pow</td><td>gelu1.pow</td><td>saving 0.25 &lt;= delta 0.45 (time saving 0.44 with 1 launch saved)</td><td class="would">delta &lt; 0.4436</td></tr>
// HTML: <td class="structural">
