// RUN: phaze-opt %s -p 'phaze-shard-tensor-parallel{width=2 sequence_parallel=true}' | filecheck %s
// RUN: phaze-opt %s -p 'phaze-shard-tensor-parallel{width=2}' | filecheck %s --check-prefix=TP
// RUN: not phaze-opt %s -p 'phaze-shard-tensor-parallel{width=8 sequence_parallel=true}' 2>&1 | filecheck %s --check-prefix=ERR

// Sequence parallelism (Megatron-SP) on a block and a column-parallel linear after it, 4 tokens
// (micro-batch 1, sequence 4) at width 2: up (column) -> gelu -> down (row) -> residual add ->
// layer norm -> up2 (column) -> sum.  The partial block output is reduce-scattered to 2 tokens
// per device (not all-reduced), the layer norm runs on them, and up2 reads an all-gather.  In
// backward: up2's partial input gradient is reduce-scattered before the norm's backward; the norm
// output is gathered again for up2's weight gradient (only the split one is saved); the norm's
// input gradient is gathered once for down's two GEMMs (a transpose is re-run on the gathered
// value).  The norm parameters' and the row-parallel bias's gradients are partial (each device
// saw its tokens): all-reduced once per step, before the optimizer, in the "opt" phase.

builtin.module attributes {phaze.micro_batch_size = 1 : i64, phaze.seq_len = 4 : i64} {
  func.func @train_step(%ln.w: tensor<8xf16> {phaze.param = "ln.w"}, %ln.b: tensor<8xf16> {phaze.param = "ln.b"}, %up.w: tensor<16x8xf16> {phaze.param = "up.w"}, %up.b: tensor<16xf16> {phaze.param = "up.b"}, %down.w: tensor<8x16xf16> {phaze.param = "down.w"}, %down.b: tensor<8xf16> {phaze.param = "down.b"}, %up2.w: tensor<16x8xf16> {phaze.param = "up2.w"}, %x: tensor<4x8xf16> {phaze.input = "x"}) -> (tensor<f32> {phaze.loss}, tensor<8xf16> {phaze.grad = "ln.w"}, tensor<8xf16> {phaze.grad = "ln.b"}, tensor<16x8xf16> {phaze.grad = "up.w"}, tensor<16xf16> {phaze.grad = "up.b"}, tensor<8x16xf16> {phaze.grad = "down.w"}, tensor<8xf16> {phaze.grad = "down.b"}, tensor<16x8xf16> {phaze.grad = "up2.w"}, tensor<16x8xf16> {phaze.updated = "up.w"}, tensor<8x16xf16> {phaze.updated = "down.w"}, tensor<16x8xf16> {phaze.updated = "up2.w"}) {
    %t1 = phaze.layout "transpose" %up.w aten "aten.t.default" {phaze.module = "up", phaze.phase = "fwd"} : (tensor<16x8xf16>) -> tensor<8x16xf16>
    %h = phaze.matmul %x, %t1, %up.b {phaze.module = "up", phaze.phase = "fwd"} : (tensor<4x8xf16>, tensor<8x16xf16>, tensor<16xf16>) -> tensor<4x16xf16>
    %g = phaze.elementwise "gelu" %h aten "aten.gelu.default" {phaze.module = "act", phaze.phase = "fwd"} : (tensor<4x16xf16>) -> tensor<4x16xf16>
    %t2 = phaze.layout "transpose" %down.w aten "aten.t.default" {phaze.module = "down", phaze.phase = "fwd"} : (tensor<8x16xf16>) -> tensor<16x8xf16>
    %y = phaze.matmul %g, %t2, %down.b {phaze.module = "down", phaze.phase = "fwd"} : (tensor<4x16xf16>, tensor<16x8xf16>, tensor<8xf16>) -> tensor<4x8xf16>
    %r = phaze.elementwise "add" %y, %x aten "aten.add.Tensor" {phaze.module = "", phaze.phase = "fwd"} : (tensor<4x8xf16>, tensor<4x8xf16>) -> tensor<4x8xf16>
    %n, %mean, %rstd = phaze.norm "layer_norm" %r, %ln.w, %ln.b normalized_rank 1 {phaze.module = "ln", phaze.phase = "fwd"} : (tensor<4x8xf16>, tensor<8xf16>, tensor<8xf16>) -> (tensor<4x8xf16>, tensor<4x1xf16>, tensor<4x1xf16>)
    %t3 = phaze.layout "transpose" %up2.w aten "aten.t.default" {phaze.module = "up2", phaze.phase = "fwd"} : (tensor<16x8xf16>) -> tensor<8x16xf16>
    %q = phaze.matmul %n, %t3 {phaze.module = "up2", phaze.phase = "fwd"} : (tensor<4x8xf16>, tensor<8x16xf16>) -> tensor<4x16xf16>
    %loss = phaze.reduction "sum" %q dims [] aten "aten.sum.default" {phaze.module = "", phaze.phase = "fwd"} : (tensor<4x16xf16>) -> tensor<f32>
    %dq = phaze.elementwise "fill" %q aten "aten.ones_like.default" {phaze.module = "", phaze.phase = "bwd"} : (tensor<4x16xf16>) -> tensor<4x16xf16>
    %t3t = phaze.layout "transpose" %t3 aten "aten.t.default" {phaze.module = "up2", phaze.phase = "bwd"} : (tensor<8x16xf16>) -> tensor<16x8xf16>
    %dn = phaze.matmul %dq, %t3t {phaze.module = "up2", phaze.phase = "bwd"} : (tensor<4x16xf16>, tensor<16x8xf16>) -> tensor<4x8xf16>
    %tdq = phaze.layout "transpose" %dq aten "aten.t.default" {phaze.module = "up2", phaze.phase = "bwd"} : (tensor<4x16xf16>) -> tensor<16x4xf16>
    %dw3 = phaze.matmul %tdq, %n {phaze.module = "up2", phaze.phase = "bwd"} : (tensor<16x4xf16>, tensor<4x8xf16>) -> tensor<16x8xf16>
    %dr, %dlnw, %dlnb = phaze.norm "layer_norm_grad" %dn, %r, %mean, %rstd, %ln.w, %ln.b normalized_rank 1 {phaze.module = "ln", phaze.phase = "bwd"} : (tensor<4x8xf16>, tensor<4x8xf16>, tensor<4x1xf16>, tensor<4x1xf16>, tensor<8xf16>, tensor<8xf16>) -> (tensor<4x8xf16>, tensor<8xf16>, tensor<8xf16>)
    %t2t = phaze.layout "transpose" %t2 aten "aten.t.default" {phaze.module = "down", phaze.phase = "bwd"} : (tensor<16x8xf16>) -> tensor<8x16xf16>
    %dg = phaze.matmul %dr, %t2t {phaze.module = "down", phaze.phase = "bwd"} : (tensor<4x8xf16>, tensor<8x16xf16>) -> tensor<4x16xf16>
    %tdr = phaze.layout "transpose" %dr aten "aten.t.default" {phaze.module = "down", phaze.phase = "bwd"} : (tensor<4x8xf16>) -> tensor<8x4xf16>
    %dw2 = phaze.matmul %tdr, %g {phaze.module = "down", phaze.phase = "bwd"} : (tensor<8x4xf16>, tensor<4x16xf16>) -> tensor<8x16xf16>
    %db2 = phaze.reduction "sum" %dr dims [0] aten "aten.sum.dim_IntList" {phaze.module = "down", phaze.phase = "bwd"} : (tensor<4x8xf16>) -> tensor<8xf16>
    %dh = phaze.elementwise "gelu_grad" %dg, %h aten "aten.gelu_backward.default" {phaze.module = "act", phaze.phase = "bwd"} : (tensor<4x16xf16>, tensor<4x16xf16>) -> tensor<4x16xf16>
    %tdh = phaze.layout "transpose" %dh aten "aten.t.default" {phaze.module = "up", phaze.phase = "bwd"} : (tensor<4x16xf16>) -> tensor<16x4xf16>
    %dw1 = phaze.matmul %tdh, %x {phaze.module = "up", phaze.phase = "bwd"} : (tensor<16x4xf16>, tensor<4x8xf16>) -> tensor<16x8xf16>
    %db1 = phaze.reduction "sum" %dh dims [0] aten "aten.sum.dim_IntList" {phaze.module = "up", phaze.phase = "bwd"} : (tensor<4x16xf16>) -> tensor<16xf16>
    %up.w.new = phaze.optimizer_update "adam" %up.w, %dw1 state_bytes 12 {phaze.module = "up", phaze.phase = "opt"} : (tensor<16x8xf16>, tensor<16x8xf16>) -> tensor<16x8xf16>
    %down.w.new = phaze.optimizer_update "adam" %down.w, %dw2 state_bytes 12 {phaze.module = "down", phaze.phase = "opt"} : (tensor<8x16xf16>, tensor<8x16xf16>) -> tensor<8x16xf16>
    %up2.w.new = phaze.optimizer_update "adam" %up2.w, %dw3 state_bytes 12 {phaze.module = "up2", phaze.phase = "opt"} : (tensor<16x8xf16>, tensor<16x8xf16>) -> tensor<16x8xf16>
    func.return %loss, %dlnw, %dlnb, %dw1, %db1, %dw2, %db2, %dw3, %up.w.new, %down.w.new, %up2.w.new : tensor<f32>, tensor<8xf16>, tensor<8xf16>, tensor<16x8xf16>, tensor<16xf16>, tensor<8x16xf16>, tensor<8xf16>, tensor<16x8xf16>, tensor<16x8xf16>, tensor<8x16xf16>, tensor<16x8xf16>
  }
}

// CHECK: builtin.module attributes {phaze.micro_batch_size = 1 : i64, phaze.seq_len = 4 : i64, phaze.tp_width = 2 : i64, phaze.sequence_parallel}
// CHECK: %y = phaze.matmul %g, %t2, %down.b {{.*}} -> tensor<4x8xf16>
// CHECK-NEXT: %r = phaze.elementwise "add" %y, %x
// CHECK-NEXT: %r_rs = phaze.collective "reduce_scatter" %r group_size 2 {phaze.phase = "fwd", phaze.module = "down"} : (tensor<4x8xf16>) -> tensor<2x8xf16>
// CHECK-NEXT: %n, %mean, %rstd = phaze.norm "layer_norm" %r_rs, %ln.w, %ln.b {{.*}} : (tensor<2x8xf16>, tensor<8xf16>, tensor<8xf16>) -> (tensor<2x8xf16>, tensor<2x1xf16>, tensor<2x1xf16>)
// CHECK: %n_ag = phaze.collective "all_gather" %n group_size 2 {phaze.phase = "fwd", phaze.module = "up2"} : (tensor<2x8xf16>) -> tensor<4x8xf16>
// CHECK-NEXT: %q = phaze.matmul %n_ag, %t3 {{.*}} : (tensor<4x8xf16>, tensor<8x8xf16>) -> tensor<4x8xf16>
// CHECK-NEXT: %loss = phaze.reduction "sum" %q
// CHECK-NEXT: %loss_ar = phaze.collective "all_reduce" %loss group_size 2

// Backward.
// CHECK: %dn = phaze.matmul %dq, %t3t {{.*}} -> tensor<4x8xf16>
// CHECK-NEXT: %dn_rs = phaze.collective "reduce_scatter" %dn group_size 2 {phaze.phase = "bwd", phaze.module = "up2"} : (tensor<4x8xf16>) -> tensor<2x8xf16>
// CHECK: %n_ag_1 = phaze.collective "all_gather" %n group_size 2 {phaze.phase = "bwd", phaze.module = "up2"} : (tensor<2x8xf16>) -> tensor<4x8xf16>
// CHECK-NEXT: %dw3 = phaze.matmul %tdq, %n_ag_1
// CHECK-NEXT: %dr, %dlnw, %dlnb = phaze.norm "layer_norm_grad" %dn_rs, %r_rs, %mean, %rstd, %ln.w, %ln.b {{.*}} : (tensor<2x8xf16>, tensor<2x8xf16>, tensor<2x1xf16>, tensor<2x1xf16>, tensor<8xf16>, tensor<8xf16>) -> (tensor<2x8xf16>, tensor<8xf16>, tensor<8xf16>)
// CHECK: %dr_ag = phaze.collective "all_gather" %dr group_size 2 {phaze.phase = "bwd", phaze.module = "down"} : (tensor<2x8xf16>) -> tensor<4x8xf16>
// CHECK-NEXT: %tdr_ag = phaze.layout "transpose" %dr_ag {{.*}} : (tensor<4x8xf16>) -> tensor<8x4xf16>
// CHECK-NEXT: %dg = phaze.matmul %dr_ag, %t2t
// CHECK-NEXT: %dw2 = phaze.matmul %tdr_ag, %g
// CHECK-NEXT: %db2 = phaze.reduction "sum" %dr {{.*}} : (tensor<2x8xf16>) -> tensor<8xf16>
// CHECK-NOT: phaze.collective
// CHECK: %up2.w.new = phaze.optimizer_update
// CHECK-NEXT: %dlnw_ar = phaze.collective "all_reduce" %dlnw group_size 2 {phaze.phase = "opt", phaze.module = "ln"}
// CHECK-NEXT: %dlnb_ar = phaze.collective "all_reduce" %dlnb group_size 2 {phaze.phase = "opt", phaze.module = "ln"}
// CHECK-NEXT: %db2_ar = phaze.collective "all_reduce" %db2 group_size 2 {phaze.phase = "opt", phaze.module = "down"}
// CHECK-NEXT: func.return %loss_ar, %dlnw_ar, %dlnb_ar, %dw1, %db1, %dw2, %db2_ar, %dw3,

// Without the option: all-reduces only, the norm on every token.
// TP: builtin.module attributes {phaze.micro_batch_size = 1 : i64, phaze.seq_len = 4 : i64, phaze.tp_width = 2 : i64} {
// TP-NOT: reduce_scatter
// TP: %r_ar = phaze.collective "all_reduce" %r group_size 2
// TP-NEXT: phaze.norm "layer_norm" %r_ar, {{.*}} : (tensor<4x8xf16>,
// TP-NOT: all_gather
// TP-NOT: reduce_scatter

// ERR: phaze-opt: error: phaze-shard-tensor-parallel: width 8 does not divide the sequence length 4 (sequence parallelism)
