// RUN: phaze-opt %s -p phaze-insert-recompute | filecheck %s
// RUN: phaze-opt %s -p "phaze-insert-recompute{optimizer=sgd}" | filecheck %s --check-prefix=SGD
// RUN: sed 's/, phaze.layer_schedule = \[[^]]*\]//' %s | not phaze-opt -p phaze-insert-recompute 2>&1 | filecheck %s --check-prefix=NOSCHED

// One attention layer (sequence 4, width 8, one head) and the backward autograd runs for it.
// Backward reads x (for the weight gradient), q and k (for the score gradient), v (for the
// probabilities' gradient) and p (for the softmax gradient and for v's gradient): the stash with
// no recompute is x, q, k, v (64 B each) and p (4 x 4 f16 = 32 B): 288 B.
// Selective recompute re-runs the attention core s = q k^T, p = softmax(s), o = p v (found by
// structure: a softmax between two matmuls of two activations); p leaves the stash: 256 B.
// Its extra time is the core's schedule: 1 + 1 + 1 us (a chain).  Full recompute keeps the
// layer's input x alone: 64 B, and costs the layer's forward makespan (phaze.layer_schedule).
// Memory: 3 weights of 8 x 8 f16 (384 B), their gradients (384 B), no optimizer update in the
// step so Adam's 12 B per element by default (2304 B; with optimizer=sgd 4 B, 768 B).  Workspace: the largest
// live set of tensors that are neither stashed nor read by an optimizer update: in the forward o
// and y (128 B), in the backward dQ and dW_q at its end (64 + 128 = 192 B); with the forward
// rematerialized for the backward (288 - 64 B more), 416 B.

builtin.module attributes {phaze.target = @acc, phaze.layer_schedule = [#phaze.layer_schedule<index = 0, fwd_s = 9.0e-06, bwd_s = 1.2e-05, opt_s = 0.0, cast_s = 0.0, tp_comm_s = 0.0, status = optimal, gap = 0.0>]} {
  phaze.accelerator @acc {name = "toy", clock_hz = 1.000000e+09 : f64, bytes_per_element = 2 : i64, tensor_cores = {count = 2 : i64, pe_x = 4 : i64, pe_y = 4 : i64, buffer_bytes = 256 : i64}, vector_cores = {count = 2 : i64, width = 4 : i64, buffer_bytes = 64 : i64}, global_buffer = {bytes = 4096 : i64, bandwidth_Bps = 6.400000e+10 : f64}, hbm = {bytes = 1073741824 : i64, bandwidth_Bps = 1.600000e+10 : f64}, network = [{name = "tray", group_size = 4 : i64, bandwidth_Bps = 1.000000e+09 : f64, latency_s = 1.000000e-06 : f64}, {name = "pod", group_size = 64 : i64, bandwidth_Bps = 5.000000e+08 : f64, latency_s = 2.000000e-06 : f64}]}
  func.func @train_step(%x: tensor<4x8xf16> {phaze.input = "x"}, %wq: tensor<8x8xf16> {phaze.param = "wq"}, %wk: tensor<8x8xf16> {phaze.param = "wk"}, %wv: tensor<8x8xf16> {phaze.param = "wv"}) -> (tensor<4x8xf16>, tensor<4x8xf16>, tensor<4x8xf16>, tensor<8x8xf16>) {
    %q = phaze.matmul %x, %wq {phaze.phase = "fwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 1.0e-06, split_s = 1.0e-06, unit = tensor, bound = compute>} : (tensor<4x8xf16>, tensor<8x8xf16>) -> tensor<4x8xf16>
    %k = phaze.matmul %x, %wk {phaze.phase = "fwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 1.0e-06, split_s = 1.0e-06, unit = tensor, bound = compute>} : (tensor<4x8xf16>, tensor<8x8xf16>) -> tensor<4x8xf16>
    %v = phaze.matmul %x, %wv {phaze.phase = "fwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 1.0e-06, split_s = 1.0e-06, unit = tensor, bound = compute>} : (tensor<4x8xf16>, tensor<8x8xf16>) -> tensor<4x8xf16>
    %kt = phaze.layout "transpose" %k aten "aten.t.default" {phaze.phase = "fwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 0.0, split_s = 0.0, unit = none, bound = none>} : (tensor<4x8xf16>) -> tensor<8x4xf16>
    %s = phaze.matmul %q, %kt {phaze.phase = "fwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 1.0e-06, split_s = 1.0e-06, unit = tensor, bound = compute>} : (tensor<4x8xf16>, tensor<8x4xf16>) -> tensor<4x4xf16>
    %p = phaze.softmax "softmax" %s dim 1 {phaze.phase = "fwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 2.0e-06, split_s = 1.0e-06, unit = vector, bound = compute>} : (tensor<4x4xf16>) -> tensor<4x4xf16>
    %o = phaze.matmul %p, %v {phaze.phase = "fwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 1.0e-06, split_s = 1.0e-06, unit = tensor, bound = compute>} : (tensor<4x4xf16>, tensor<4x8xf16>) -> tensor<4x8xf16>
    %y = phaze.elementwise "add" %o, %x aten "aten.add.Tensor" {phaze.phase = "fwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 1.0e-06, split_s = 1.0e-06, unit = vector, bound = hbm>} : (tensor<4x8xf16>, tensor<4x8xf16>) -> tensor<4x8xf16>
    %go = phaze.elementwise "fill" aten "aten.ones_like.default" {phaze.phase = "bwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 1.0e-06, split_s = 1.0e-06, unit = vector, bound = hbm>} : () -> tensor<4x8xf16>
    %pt = phaze.layout "transpose" %p aten "aten.t.default" {phaze.phase = "bwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 0.0, split_s = 0.0, unit = none, bound = none>} : (tensor<4x4xf16>) -> tensor<4x4xf16>
    %gv = phaze.matmul %pt, %go {phaze.phase = "bwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 1.0e-06, split_s = 1.0e-06, unit = tensor, bound = compute>} : (tensor<4x4xf16>, tensor<4x8xf16>) -> tensor<4x8xf16>
    %vt = phaze.layout "transpose" %v aten "aten.t.default" {phaze.phase = "bwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 0.0, split_s = 0.0, unit = none, bound = none>} : (tensor<4x8xf16>) -> tensor<8x4xf16>
    %gp = phaze.matmul %go, %vt {phaze.phase = "bwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 1.0e-06, split_s = 1.0e-06, unit = tensor, bound = compute>} : (tensor<4x8xf16>, tensor<8x4xf16>) -> tensor<4x4xf16>
    %gs = phaze.softmax "softmax_grad" %gp, %p dim 1 {phaze.phase = "bwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 2.0e-06, split_s = 1.0e-06, unit = vector, bound = compute>} : (tensor<4x4xf16>, tensor<4x4xf16>) -> tensor<4x4xf16>
    %gq = phaze.matmul %gs, %k {phaze.phase = "bwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 1.0e-06, split_s = 1.0e-06, unit = tensor, bound = compute>} : (tensor<4x4xf16>, tensor<4x8xf16>) -> tensor<4x8xf16>
    %gst = phaze.layout "transpose" %gs aten "aten.t.default" {phaze.phase = "bwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 0.0, split_s = 0.0, unit = none, bound = none>} : (tensor<4x4xf16>) -> tensor<4x4xf16>
    %gk = phaze.matmul %gst, %q {phaze.phase = "bwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 1.0e-06, split_s = 1.0e-06, unit = tensor, bound = compute>} : (tensor<4x4xf16>, tensor<4x8xf16>) -> tensor<4x8xf16>
    %xt = phaze.layout "transpose" %x aten "aten.t.default" {phaze.phase = "bwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 0.0, split_s = 0.0, unit = none, bound = none>} : (tensor<4x8xf16>) -> tensor<8x4xf16>
    %gwq = phaze.matmul %xt, %gq {phaze.phase = "bwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 1.0e-06, split_s = 1.0e-06, unit = tensor, bound = compute>} : (tensor<8x4xf16>, tensor<4x8xf16>) -> tensor<8x8xf16>
    func.return %y, %gv, %gk, %gwq : tensor<4x8xf16>, tensor<4x8xf16>, tensor<4x8xf16>, tensor<8x8xf16>
  }
}

// CHECK: phaze.layer_recompute = [#phaze.layer_recompute<index = 0, none_bytes = 288, selective_bytes = 256, full_bytes = 64, selective_s = 3.0e-06, full_s = 9.0e-06>]
// CHECK-SAME: phaze.layer_memory = [#phaze.layer_memory<index = 0, param_bytes = 384, grad_bytes = 384, optimizer_bytes = 2304, saved_none_bytes = 288, saved_selective_bytes = 256, saved_full_bytes = 64, workspace_bytes = 192, recompute_workspace_bytes = 416, expert_param_bytes = 0, expert_optimizer_bytes = 0, fp8_weight_bytes = 0>]
// CHECK: %q = phaze.matmul %x, %wq {phaze.phase = "fwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<{{[^>]*}}>} :
// CHECK: %kt = phaze.layout "transpose" %k aten "aten.t.default" {phaze.phase = "fwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<{{[^>]*}}>} :
// CHECK-NEXT: %s = phaze.matmul {{.*}}phaze.recompute = #phaze<recompute_policy selective>
// CHECK-NEXT: %p = phaze.softmax {{.*}}phaze.recompute = #phaze<recompute_policy selective>
// CHECK-NEXT: %o = phaze.matmul {{.*}}phaze.recompute = #phaze<recompute_policy selective>
// CHECK-NOT: phaze.recompute = #phaze<recompute_policy selective>
// CHECK: func.return

// SGD: phaze.layer_memory = [#phaze.layer_memory<index = 0, param_bytes = 384, grad_bytes = 384, optimizer_bytes = 768,

// NOSCHED: error: 'builtin.module' op requires 'phaze.layer_schedule'; run phaze-schedule-ops first
