// --opfuse-report prints the fusion report instead of the IR (its figures are tested with
// the passes; this checks the format).

// RUN: fuse-opt %S/Inputs/add.mlir --opfuse-report=text | filecheck %s --check-prefix=TEXT
// TEXT: kernels: {{[0-9]+}} -> {{[0-9]+}} ({{[0-9]+}} launches saved)
// TEXT-NEXT: bytes: {{[0-9.]+}} {{K?M?i?B}} -> {{[0-9.]+}} {{K?M?i?B}} ({{[-+][0-9.]+}}%)
// TEXT-NEXT: flops:
// TEXT: kernel {{.*}}: kind=
// TEXT-NOT: module

// RUN: fuse-opt %S/Inputs/add.mlir --opfuse-report=json | filecheck %s --check-prefix=JSON
// JSON: "decisions": [
// JSON: "kernels": [
// JSON: "totals": {
// JSON: "after": {
// JSON: "before": {

// Remarks go to stderr, one per decision, like MLIR remarks.
// RUN: fuse-opt %S/Inputs/add.mlir --opfuse-remarks 2>&1 >/dev/null | filecheck %s --check-prefix=REMARK
// REMARK: add.mlir:{{[0-9]+}}:{{[0-9]+}}: remark: [opfuse-

// With --split-input-file, a JSON report per chunk, as one JSON list.
// RUN: fuse-opt %S/Inputs/add.mlir --split-input-file --opfuse-report=json | filecheck %s --check-prefix=LIST
// LIST: [
// LIST-NEXT: {

// --opfuse-report=html -o FILE: one self-contained page (graph before/after, charts),
// no URL anywhere (no network needed to view it).
// RUN: fuse-opt %S/Inputs/add.mlir --opfuse-report=html -o %t.html
// RUN: filecheck %s --check-prefix=HTML < %t.html
// HTML: <!DOCTYPE html>
// HTML-NOT: {{https?:|src=}}
// HTML: <figure class="view before">
// HTML: <figure class="view after">
// HTML: <svg class="graph-svg"
// HTML: class="cluster kind-loop k0"
// HTML: data-chart="bytes"
// HTML: data-chart="launches"
// HTML: </html>
