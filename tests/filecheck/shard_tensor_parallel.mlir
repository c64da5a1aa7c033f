// RUN: phaze-opt %s -p 'phaze-shard-tensor-parallel{width=2}' | filecheck %s
// RUN: phaze-opt %s -p 'phaze-shard-tensor-parallel{width=1}' | filecheck %s --check-prefix=ONE
// RUN: not phaze-opt %s -p 'phaze-shard-tensor-parallel{width=3}' 2>&1 | filecheck %s --check-prefix=ERR

// One MLP block of a training step: layer norm, column-parallel linear (nn.Linear weight
// [out, in], used through a transpose), gelu, row-parallel linear, residual add; its backward
// (input- and weight-gradient GEMMs) and two optimizer updates.  At width 2 the up projection's
// weight, bias and output split along the FFN dim (16 -> 8), the down projection's weight along
// its input dim; the forward all-reduces the partial block output (after the residual add,
// which one device adds), the backward the partial input gradient of the up projection before
// the layer norm's backward.  Weight gradients of split weights are local.

builtin.module {
  func.func @train_step(%ln.w: tensor<8xf16> {phaze.param = "ln.w"}, %ln.b: tensor<8xf16> {phaze.param = "ln.b"}, %up.w: tensor<16x8xf16> {phaze.param = "up.w"}, %up.b: tensor<16xf16> {phaze.param = "up.b"}, %down.w: tensor<8x16xf16> {phaze.param = "down.w"}, %down.b: tensor<8xf16> {phaze.param = "down.b"}, %x: tensor<4x8xf16> {phaze.input = "x"}) -> (tensor<f32> {phaze.loss}, tensor<8xf16> {phaze.grad = "ln.w"}, tensor<8xf16> {phaze.grad = "ln.b"}, tensor<16x8xf16> {phaze.grad = "up.w"}, tensor<16xf16> {phaze.grad = "up.b"}, tensor<8x16xf16> {phaze.grad = "down.w"}, tensor<8xf16> {phaze.grad = "down.b"}, tensor<16x8xf16> {phaze.updated = "up.w"}, tensor<8x16xf16> {phaze.updated = "down.w"}) {
    %n, %mean, %rstd = phaze.norm "layer_norm" %x, %ln.w, %ln.b normalized_rank 1 {phaze.module = "ln", phaze.phase = "fwd"} : (tensor<4x8xf16>, tensor<8xf16>, tensor<8xf16>) -> (tensor<4x8xf16>, tensor<4x1xf16>, tensor<4x1xf16>)
    %t1 = phaze.layout "transpose" %up.w aten "aten.t.default" {phaze.module = "up", phaze.phase = "fwd"} : (tensor<16x8xf16>) -> tensor<8x16xf16>
    %h = phaze.matmul %n, %t1, %up.b {phaze.module = "up", phaze.phase = "fwd"} : (tensor<4x8xf16>, tensor<8x16xf16>, tensor<16xf16>) -> tensor<4x16xf16>
    %g = phaze.elementwise "gelu" %h aten "aten.gelu.default" {phaze.module = "act", phaze.phase = "fwd"} : (tensor<4x16xf16>) -> tensor<4x16xf16>
    %t2 = phaze.layout "transpose" %down.w aten "aten.t.default" {phaze.module = "down", phaze.phase = "fwd"} : (tensor<8x16xf16>) -> tensor<16x8xf16>
    %y = phaze.matmul %g, %t2, %down.b {phaze.module = "down", phaze.phase = "fwd"} : (tensor<4x16xf16>, tensor<16x8xf16>, tensor<8xf16>) -> tensor<4x8xf16>
    %r = phaze.elementwise "add" %y, %x aten "aten.add.Tensor" {phaze.module = "", phaze.phase = "fwd"} : (tensor<4x8xf16>, tensor<4x8xf16>) -> tensor<4x8xf16>
    %loss = phaze.reduction "sum" %r dims [] aten "aten.sum.default" {phaze.module = "", phaze.phase = "fwd"} : (tensor<4x8xf16>) -> tensor<f32>
    %dr = phaze.elementwise "fill" aten "aten.ones_like.default" {phaze.module = "", phaze.phase = "bwd"} : () -> tensor<4x8xf16>
    %t2t = phaze.layout "transpose" %t2 aten "aten.t.default" {phaze.module = "down", phaze.phase = "bwd"} : (tensor<16x8xf16>) -> tensor<8x16xf16>
    %dg = phaze.matmul %dr, %t2t {phaze.module = "down", phaze.phase = "bwd"} : (tensor<4x8xf16>, tensor<8x16xf16>) -> tensor<4x16xf16>
    %tdr = phaze.layout "transpose" %dr aten "aten.t.default" {phaze.module = "down", phaze.phase = "bwd"} : (tensor<4x8xf16>) -> tensor<8x4xf16>
    %dw2 = phaze.matmul %tdr, %g {phaze.module = "down", phaze.phase = "bwd"} : (tensor<8x4xf16>, tensor<4x16xf16>) -> tensor<8x16xf16>
    %db2 = phaze.reduction "sum" %dr dims [0] aten "aten.sum.dim_IntList" {phaze.module = "down", phaze.phase = "bwd"} : (tensor<4x8xf16>) -> tensor<8xf16>
    %dh = phaze.elementwise "gelu_grad" %dg, %h aten "aten.gelu_backward.default" {phaze.module = "act", phaze.phase = "bwd"} : (tensor<4x16xf16>, tensor<4x16xf16>) -> tensor<4x16xf16>
    %t1t = phaze.layout "transpose" %t1 aten "aten.t.default" {phaze.module = "up", phaze.phase = "bwd"} : (tensor<8x16xf16>) -> tensor<16x8xf16>
    %dn = phaze.matmul %dh, %t1t {phaze.module = "up", phaze.phase = "bwd"} : (tensor<4x16xf16>, tensor<16x8xf16>) -> tensor<4x8xf16>
    %tdh = phaze.layout "transpose" %dh aten "aten.t.default" {phaze.module = "up", phaze.phase = "bwd"} : (tensor<4x16xf16>) -> tensor<16x4xf16>
    %dw1 = phaze.matmul %tdh, %n {phaze.module = "up", phaze.phase = "bwd"} : (tensor<16x4xf16>, tensor<4x8xf16>) -> tensor<16x8xf16>
    %db1 = phaze.reduction "sum" %dh dims [0] aten "aten.sum.dim_IntList" {phaze.module = "up", phaze.phase = "bwd"} : (tensor<4x16xf16>) -> tensor<16xf16>
    %dx, %dlnw, %dlnb = phaze.norm "layer_norm_grad" %dn, %x, %mean, %rstd, %ln.w, %ln.b normalized_rank 1 {phaze.module = "ln", phaze.phase = "bwd"} : (tensor<4x8xf16>, tensor<4x8xf16>, tensor<4x1xf16>, tensor<4x1xf16>, tensor<8xf16>, tensor<8xf16>) -> (tensor<4x8xf16>, tensor<8xf16>, tensor<8xf16>)
    %up.w.new = phaze.optimizer_update "adam" %up.w, %dw1 state_bytes 12 {phaze.module = "up", phaze.phase = "opt"} : (tensor<16x8xf16>, tensor<16x8xf16>) -> tensor<16x8xf16>
    %down.w.new = phaze.optimizer_update "adam" %down.w, %dw2 state_bytes 12 {phaze.module = "down", phaze.phase = "opt"} : (tensor<8x16xf16>, tensor<8x16xf16>) -> tensor<8x16xf16>
    func.return %loss, %dlnw, %dlnb, %dw1, %db1, %dw2, %db2, %up.w.new, %down.w.new : tensor<f32>, tensor<8xf16>, tensor<8xf16>, tensor<16x8xf16>, tensor<16xf16>, tensor<8x16xf16>, tensor<8xf16>, tensor<16x8xf16>, tensor<8x16xf16>
  }
}

// Module attribute, then the signature: split weights and their gradients/updates are halved,
// the norm parameters and the row-parallel bias stay whole.
// CHECK: builtin.module attributes {phaze.tp_width = 2 : i64}
// CHECK: func.func @train_step(%ln.w: tensor<8xf16> {phaze.param = "ln.w"}, %ln.b: tensor<8xf16> {phaze.param = "ln.b"}, %up.w: tensor<8x8xf16> {phaze.param = "up.w"}, %up.b: tensor<8xf16> {phaze.param = "up.b"}, %down.w: tensor<8x8xf16> {phaze.param = "down.w"}, %down.b: tensor<8xf16> {phaze.param = "down.b"}, %x: tensor<4x8xf16> {phaze.input = "x"})
// CHECK-SAME: -> (tensor<f32> {phaze.loss}, tensor<8xf16> {phaze.grad = "ln.w"}, tensor<8xf16> {phaze.grad = "ln.b"}, tensor<8x8xf16> {phaze.grad = "up.w"}, tensor<8xf16> {phaze.grad = "up.b"}, tensor<8x8xf16> {phaze.grad = "down.w"}, tensor<8xf16> {phaze.grad = "down.b"}, tensor<8x8xf16> {phaze.updated = "up.w"}, tensor<8x8xf16> {phaze.updated = "down.w"})

// Forward: column-parallel up projection, local gelu, row-parallel down projection; the block
// output is partial until one all-reduce (phase and module of the GEMM that made it partial).
// CHECK: %t1 = phaze.layout "transpose" %up.w {{.*}} : (tensor<8x8xf16>) -> tensor<8x8xf16>
// CHECK-NEXT: %h = phaze.matmul %n, %t1, %up.b {{.*}} : (tensor<4x8xf16>, tensor<8x8xf16>, tensor<8xf16>) -> tensor<4x8xf16>
// CHECK-NEXT: %g = phaze.elementwise "gelu" %h {{.*}} : (tensor<4x8xf16>) -> tensor<4x8xf16>
// CHECK-NEXT: %t2 = phaze.layout "transpose" %down.w {{.*}} : (tensor<8x8xf16>) -> tensor<8x8xf16>
// CHECK-NEXT: %y = phaze.matmul %g, %t2, %down.b {{.*}} : (tensor<4x8xf16>, tensor<8x8xf16>, tensor<8xf16>) -> tensor<4x8xf16>
// CHECK-NEXT: %r = phaze.elementwise "add" %y, %x
// CHECK-NEXT: %r_ar = phaze.collective "all_reduce" %r group_size 2 {phaze.phase = "fwd", phaze.module = "down"} : (tensor<4x8xf16>) -> tensor<4x8xf16>
// CHECK-NEXT: %loss = phaze.reduction "sum" %r_ar

// Backward: the row-parallel layer's input gradient and weight gradient come out split (no
// communication), its bias gradient whole; the column-parallel layer's input gradient is
// partial and all-reduced once, before the layer norm's backward.
// CHECK: %dg = phaze.matmul %dr, %t2t {{.*}} : (tensor<4x8xf16>, tensor<8x8xf16>) -> tensor<4x8xf16>
// CHECK: %dw2 = phaze.matmul %tdr, %g {{.*}} : (tensor<8x4xf16>, tensor<4x8xf16>) -> tensor<8x8xf16>
// CHECK-NEXT: %db2 = phaze.reduction "sum" %dr {{.*}} : (tensor<4x8xf16>) -> tensor<8xf16>
// CHECK-NEXT: %dh = phaze.elementwise "gelu_grad" %dg, %h {{.*}} : (tensor<4x8xf16>, tensor<4x8xf16>) -> tensor<4x8xf16>
// CHECK: %dn = phaze.matmul %dh, %t1t {{.*}} : (tensor<4x8xf16>, tensor<8x8xf16>) -> tensor<4x8xf16>
// CHECK-NEXT: %dn_ar = phaze.collective "all_reduce" %dn group_size 2 {phaze.phase = "bwd", phaze.module = "up"} : (tensor<4x8xf16>) -> tensor<4x8xf16>
// CHECK: %dw1 = phaze.matmul %tdh, %n {{.*}} : (tensor<8x4xf16>, tensor<4x8xf16>) -> tensor<8x8xf16>
// CHECK-NEXT: %db1 = phaze.reduction "sum" %dh {{.*}} : (tensor<4x8xf16>) -> tensor<8xf16>
// CHECK-NEXT: %dx, %dlnw, %dlnb = phaze.norm "layer_norm_grad" %dn_ar, %x
// CHECK-NEXT: %up.w.new = phaze.optimizer_update "adam" %up.w, %dw1 {{.*}} : (tensor<8x8xf16>, tensor<8x8xf16>) -> tensor<8x8xf16>
// CHECK-NEXT: %down.w.new = phaze.optimizer_update "adam" %down.w, %dw2 {{.*}} : (tensor<8x8xf16>, tensor<8x8xf16>) -> tensor<8x8xf16>
// CHECK-NOT: phaze.collective

// Width 1 changes nothing but the module attribute.
// ONE: builtin.module attributes {phaze.tp_width = 1 : i64}
// ONE: %up.w: tensor<16x8xf16>
// ONE-NOT: phaze.collective

// ERR: phaze-opt: error: phaze-shard-tensor-parallel: width 3 does not divide the output size 16 of the column-parallel linear up in layer 0 (prologue)
