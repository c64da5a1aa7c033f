// RUN: phaze-opt %s -p 'phaze-shard-tensor-parallel{width=2}' | filecheck %s
// RUN: phaze-opt %s -p 'phaze-shard-tensor-parallel{width=4}' 2>/dev/null | filecheck %s --check-prefix=KV
// RUN: phaze-opt %s -p 'phaze-shard-tensor-parallel{width=4}' 2>&1 >/dev/null | filecheck %s --check-prefix=SAID

// Grouped-query attention as the importer expands a fused attention kernel: 8 tokens, hidden
// 8, 4 query heads and 2 key/value heads of 2.  K and V are repeated over the query heads
// (`phaze.layout "repeat"`, aten "attention": each key/value head twice in place), and the
// backward sums the repeated heads' gradients back (`phaze.reduction "sum" dims [1]`, aten
// "attention").  Forward q, k, v projections, scores, softmax, output projection; backward the
// path to the key projection's weight gradient.

builtin.module {
  func.func @train_step(%wq: tensor<8x8xf16> {phaze.param = "wq"}, %wk: tensor<4x8xf16> {phaze.param = "wk"}, %wv: tensor<4x8xf16> {phaze.param = "wv"}, %wo: tensor<8x8xf16> {phaze.param = "wo"}, %x: tensor<8x8xf16> {phaze.input = "x"}) -> (tensor<f32> {phaze.loss}, tensor<4x8xf16> {phaze.grad = "wk"}) {
    %tq = phaze.layout "transpose" %wq aten "aten.t.default" {phaze.module = "q", phaze.phase = "fwd"} : (tensor<8x8xf16>) -> tensor<8x8xf16>
    %q = phaze.matmul %x, %tq {phaze.module = "q", phaze.phase = "fwd"} : (tensor<8x8xf16>, tensor<8x8xf16>) -> tensor<8x8xf16>
    %q4 = phaze.layout "view" %q aten "aten.view.default" {phaze.module = "attn", phaze.phase = "fwd"} : (tensor<8x8xf16>) -> tensor<1x8x4x2xf16>
    %qh = phaze.layout "transpose" %q4 aten "aten.transpose.int" {phaze.module = "attn", phaze.phase = "fwd"} : (tensor<1x8x4x2xf16>) -> tensor<1x4x8x2xf16>
    %tk = phaze.layout "transpose" %wk aten "aten.t.default" {phaze.module = "k", phaze.phase = "fwd"} : (tensor<4x8xf16>) -> tensor<8x4xf16>
    %k = phaze.matmul %x, %tk {phaze.module = "k", phaze.phase = "fwd"} : (tensor<8x8xf16>, tensor<8x4xf16>) -> tensor<8x4xf16>
    %k4 = phaze.layout "view" %k aten "aten.view.default" {phaze.module = "attn", phaze.phase = "fwd"} : (tensor<8x4xf16>) -> tensor<1x8x2x2xf16>
    %kh = phaze.layout "transpose" %k4 aten "aten.transpose.int" {phaze.module = "attn", phaze.phase = "fwd"} : (tensor<1x8x2x2xf16>) -> tensor<1x2x8x2xf16>
    %tv = phaze.layout "transpose" %wv aten "aten.t.default" {phaze.module = "v", phaze.phase = "fwd"} : (tensor<4x8xf16>) -> tensor<8x4xf16>
    %v = phaze.matmul %x, %tv {phaze.module = "v", phaze.phase = "fwd"} : (tensor<8x8xf16>, tensor<8x4xf16>) -> tensor<8x4xf16>
    %v4 = phaze.layout "view" %v aten "aten.view.default" {phaze.module = "attn", phaze.phase = "fwd"} : (tensor<8x4xf16>) -> tensor<1x8x2x2xf16>
    %vh = phaze.layout "transpose" %v4 aten "aten.transpose.int" {phaze.module = "attn", phaze.phase = "fwd"} : (tensor<1x8x2x2xf16>) -> tensor<1x2x8x2xf16>
    %kr = phaze.layout "repeat" %kh aten "attention" {phaze.module = "attn", phaze.phase = "fwd"} : (tensor<1x2x8x2xf16>) -> tensor<1x4x8x2xf16>
    %vr = phaze.layout "repeat" %vh aten "attention" {phaze.module = "attn", phaze.phase = "fwd"} : (tensor<1x2x8x2xf16>) -> tensor<1x4x8x2xf16>
    %krt = phaze.layout "transpose" %kr aten "attention" {phaze.module = "attn", phaze.phase = "fwd"} : (tensor<1x4x8x2xf16>) -> tensor<1x4x2x8xf16>
    %s = phaze.matmul %qh, %krt {phaze.module = "attn", phaze.phase = "fwd"} : (tensor<1x4x8x2xf16>, tensor<1x4x2x8xf16>) -> tensor<1x4x8x8xf16>
    %p = phaze.softmax "softmax" %s dim -1 {phaze.module = "attn", phaze.phase = "fwd"} : (tensor<1x4x8x8xf16>) -> tensor<1x4x8x8xf16>
    %o = phaze.matmul %p, %vr {phaze.module = "attn", phaze.phase = "fwd"} : (tensor<1x4x8x8xf16>, tensor<1x4x8x2xf16>) -> tensor<1x4x8x2xf16>
    %ot = phaze.layout "transpose" %o aten "aten.transpose.int" {phaze.module = "attn", phaze.phase = "fwd"} : (tensor<1x4x8x2xf16>) -> tensor<1x8x4x2xf16>
    %o2 = phaze.layout "view" %ot aten "aten.view.default" {phaze.module = "attn", phaze.phase = "fwd"} : (tensor<1x8x4x2xf16>) -> tensor<8x8xf16>
    %to = phaze.layout "transpose" %wo aten "aten.t.default" {phaze.module = "o", phaze.phase = "fwd"} : (tensor<8x8xf16>) -> tensor<8x8xf16>
    %y = phaze.matmul %o2, %to {phaze.module = "o", phaze.phase = "fwd"} : (tensor<8x8xf16>, tensor<8x8xf16>) -> tensor<8x8xf16>
    %loss = phaze.reduction "sum" %y dims [] aten "aten.sum.default" {phaze.module = "", phaze.phase = "fwd"} : (tensor<8x8xf16>) -> tensor<f32>
    %dy = phaze.elementwise "fill" aten "aten.ones_like.default" {phaze.module = "", phaze.phase = "bwd"} : () -> tensor<8x8xf16>
    %tot = phaze.layout "transpose" %to aten "aten.t.default" {phaze.module = "o", phaze.phase = "bwd"} : (tensor<8x8xf16>) -> tensor<8x8xf16>
    %do2 = phaze.matmul %dy, %tot {phaze.module = "o", phaze.phase = "bwd"} : (tensor<8x8xf16>, tensor<8x8xf16>) -> tensor<8x8xf16>
    %do4 = phaze.layout "view" %do2 aten "aten.view.default" {phaze.module = "attn", phaze.phase = "bwd"} : (tensor<8x8xf16>) -> tensor<1x8x4x2xf16>
    %doh = phaze.layout "transpose" %do4 aten "aten.transpose.int" {phaze.module = "attn", phaze.phase = "bwd"} : (tensor<1x8x4x2xf16>) -> tensor<1x4x8x2xf16>
    %vrt = phaze.layout "transpose" %vr aten "attention" {phaze.module = "attn", phaze.phase = "bwd"} : (tensor<1x4x8x2xf16>) -> tensor<1x4x2x8xf16>
    %dp = phaze.matmul %doh, %vrt {phaze.module = "attn", phaze.phase = "bwd"} : (tensor<1x4x8x2xf16>, tensor<1x4x2x8xf16>) -> tensor<1x4x8x8xf16>
    %ds = phaze.softmax "softmax_grad" %dp, %p dim -1 {phaze.module = "attn", phaze.phase = "bwd"} : (tensor<1x4x8x8xf16>, tensor<1x4x8x8xf16>) -> tensor<1x4x8x8xf16>
    %dst = phaze.layout "transpose" %ds aten "attention" {phaze.module = "attn", phaze.phase = "bwd"} : (tensor<1x4x8x8xf16>) -> tensor<1x4x8x8xf16>
    %dkr = phaze.matmul %dst, %qh {phaze.module = "attn", phaze.phase = "bwd"} : (tensor<1x4x8x8xf16>, tensor<1x4x8x2xf16>) -> tensor<1x4x8x2xf16>
    %dkh = phaze.reduction "sum" %dkr dims [1] aten "attention" {phaze.module = "attn", phaze.phase = "bwd"} : (tensor<1x4x8x2xf16>) -> tensor<1x2x8x2xf16>
    %dk4 = phaze.layout "transpose" %dkh aten "aten.transpose.int" {phaze.module = "attn", phaze.phase = "bwd"} : (tensor<1x2x8x2xf16>) -> tensor<1x8x2x2xf16>
    %dk = phaze.layout "view" %dk4 aten "aten.view.default" {phaze.module = "attn", phaze.phase = "bwd"} : (tensor<1x8x2x2xf16>) -> tensor<8x4xf16>
    %dkt = phaze.layout "transpose" %dk aten "aten.t.default" {phaze.module = "k", phaze.phase = "bwd"} : (tensor<8x4xf16>) -> tensor<4x8xf16>
    %dwk = phaze.matmul %dkt, %x {phaze.module = "k", phaze.phase = "bwd"} : (tensor<4x8xf16>, tensor<8x8xf16>) -> tensor<4x8xf16>
    func.return %loss, %dwk : tensor<f32>, tensor<4x8xf16>
  }
}

// Width 2 divides the 2 key/value heads: q, k and v column-parallel (2 query heads and 1
// key/value head per device), the repeat local (1 -> 2 heads), o row-parallel, and the
// backward sum of the repeated heads local (2 -> 1): the key projection's weight gradient
// comes out split with no collective.
// CHECK: func.func @train_step(%wq: tensor<4x8xf16> {phaze.param = "wq"}, %wk: tensor<2x8xf16> {phaze.param = "wk"}, %wv: tensor<2x8xf16> {phaze.param = "wv"}, %wo: tensor<8x4xf16> {phaze.param = "wo"}, %x: tensor<8x8xf16> {phaze.input = "x"})
// CHECK-SAME: -> (tensor<f32> {phaze.loss}, tensor<2x8xf16> {phaze.grad = "wk"})
// CHECK: %kr = phaze.layout "repeat" %kh aten "attention" {{.*}} : (tensor<1x1x8x2xf16>) -> tensor<1x2x8x2xf16>
// CHECK-NEXT: %vr = phaze.layout "repeat" %vh aten "attention" {{.*}} : (tensor<1x1x8x2xf16>) -> tensor<1x2x8x2xf16>
// CHECK: %s = phaze.matmul %qh, %krt {{.*}} : (tensor<1x2x8x2xf16>, tensor<1x2x2x8xf16>) -> tensor<1x2x8x8xf16>
// CHECK: %y_ar = phaze.collective "all_reduce" %y group_size 2
// CHECK: %dkh = phaze.reduction "sum" %dkr dims [1] aten "attention" {{.*}} : (tensor<1x2x8x2xf16>) -> tensor<1x1x8x2xf16>
// CHECK-NOT: phaze.collective
// CHECK: %dwk = phaze.matmul %dkt, %x {{.*}} : (tensor<2x8xf16>, tensor<8x8xf16>) -> tensor<2x8xf16>
// CHECK-NOT: phaze.tp_replicated

// Width 4 is a multiple of the 2 key/value heads: k and v stay replicated, each device
// repeats the key/value head its 1 query head reads (2 -> 1 heads: the repeat makes the
// split); the backward sum is partial (a device holds part of one group) and all-reduced
// before the key projection's weight gradient, which is whole.  Said on the module.
// KV: builtin.module attributes {phaze.tp_replicated = [#phaze.replicated_linears<reason = "kv_heads", width = 4, count = 2, total = 4, module = "k", flops_share = 0.3333333333333333, param_share = {{.*}}>], phaze.tp_width = 4 : i64}
// KV: func.func @train_step(%wq: tensor<2x8xf16> {phaze.param = "wq"}, %wk: tensor<4x8xf16> {phaze.param = "wk"}, %wv: tensor<4x8xf16> {phaze.param = "wv"}, %wo: tensor<8x2xf16> {phaze.param = "wo"}, %x: tensor<8x8xf16> {phaze.input = "x"})
// KV: %k = phaze.matmul %x, %tk {{.*}} : (tensor<8x8xf16>, tensor<8x4xf16>) -> tensor<8x4xf16>
// KV: %kr = phaze.layout "repeat" %kh aten "attention" {{.*}} : (tensor<1x2x8x2xf16>) -> tensor<1x1x8x2xf16>
// KV: %s = phaze.matmul %qh, %krt {{.*}} : (tensor<1x1x8x2xf16>, tensor<1x1x2x8xf16>) -> tensor<1x1x8x8xf16>
// KV: %dkh = phaze.reduction "sum" %dkr dims [1] aten "attention" {{.*}} : (tensor<1x1x8x2xf16>) -> tensor<1x2x8x2xf16>
// KV: %dkt_ar = phaze.collective "all_reduce" %dkt group_size 4 {phaze.phase = "bwd", phaze.module = "attn"} : (tensor<4x8xf16>) -> tensor<4x8xf16>
// KV-NEXT: %dwk = phaze.matmul %dkt_ar, %x {{.*}} : (tensor<4x8xf16>, tensor<8x8xf16>) -> tensor<4x8xf16>

// SAID: tensor parallelism (width 4) keeps the 2 key/value projections of grouped-query attention replicated (first: k in layer 0
