// RUN: phaze-opt %s -p phaze-group-layers | filecheck %s

// Two blocks (children of the module list "blocks") and a head holding the loss.  Backward ops
// follow the module they differentiate; the loss seed (module "") goes with the head.

builtin.module {
  func.func @train_step(%blocks.0.w: tensor<4x4xf16> {phaze.param = "blocks.0.w"}, %blocks.1.w: tensor<4x4xf16> {phaze.param = "blocks.1.w"}, %x: tensor<2x4xf16> {phaze.input = "x"}) -> (tensor<f32> {phaze.loss}, tensor<4x4xf16> {phaze.grad = "blocks.0.w"}, tensor<4x4xf16> {phaze.grad = "blocks.1.w"}) {
    %h0 = phaze.matmul %x, %blocks.0.w {phaze.module = "blocks.0", phaze.phase = "fwd"} : (tensor<2x4xf16>, tensor<4x4xf16>) -> tensor<2x4xf16>
    %h1 = phaze.matmul %h0, %blocks.1.w {phaze.module = "blocks.1", phaze.phase = "fwd"} : (tensor<2x4xf16>, tensor<4x4xf16>) -> tensor<2x4xf16>
    %loss = phaze.reduction "sum" %h1 dims [] aten "aten.sum.default" {phaze.module = "", phaze.phase = "fwd"} : (tensor<2x4xf16>) -> tensor<f32>
    %g = phaze.elementwise "fill" aten "aten.ones_like.default" {phaze.module = "", phaze.phase = "bwd"} : () -> tensor<2x4xf16>
    %t1 = phaze.layout "transpose" %h0 aten "aten.t.default" {phaze.module = "blocks.1", phaze.phase = "bwd"} : (tensor<2x4xf16>) -> tensor<4x2xf16>
    %gw1 = phaze.matmul %t1, %g {phaze.module = "blocks.1", phaze.phase = "bwd"} : (tensor<4x2xf16>, tensor<2x4xf16>) -> tensor<4x4xf16>
    %tw1 = phaze.layout "transpose" %blocks.1.w aten "aten.t.default" {phaze.module = "blocks.1", phaze.phase = "bwd"} : (tensor<4x4xf16>) -> tensor<4x4xf16>
    %g0 = phaze.matmul %g, %tw1 {phaze.module = "blocks.1", phaze.phase = "bwd"} : (tensor<2x4xf16>, tensor<4x4xf16>) -> tensor<2x4xf16>
    %tx = phaze.layout "transpose" %x aten "aten.t.default" {phaze.module = "blocks.0", phaze.phase = "bwd"} : (tensor<2x4xf16>) -> tensor<4x2xf16>
    %gw0 = phaze.matmul %tx, %g0 {phaze.module = "blocks.0", phaze.phase = "bwd"} : (tensor<4x2xf16>, tensor<2x4xf16>) -> tensor<4x4xf16>
    func.return %loss, %gw0, %gw1 : tensor<f32>, tensor<4x4xf16>, tensor<4x4xf16>
  }
}

// CHECK: phaze.layers = [#phaze.layer_info<index = 0, kind = block, module = "blocks.0", same_as = 0, param_bytes = 32, saved_bytes = 16, boundary_bytes = 16, grad_boundary_bytes = 16, fwd_flops = 64, bwd_flops = 64, opt_flops = 0, num_ops = 3, experts = 0, dispatch_bytes = 0>,
// CHECK-SAME: #phaze.layer_info<index = 1, kind = block, module = "blocks.1", same_as = 1, param_bytes = 32, saved_bytes = 16, boundary_bytes = 16, grad_boundary_bytes = 16, fwd_flops = 64, bwd_flops = 128, opt_flops = 0, num_ops = 5, experts = 0, dispatch_bytes = 0>,
// CHECK-SAME: #phaze.layer_info<index = 2, kind = head, module = "", same_as = 2, param_bytes = 0, saved_bytes = 0, boundary_bytes = 0, grad_boundary_bytes = 0, fwd_flops = 8, bwd_flops = 0, opt_flops = 0, num_ops = 2, experts = 0, dispatch_bytes = 0>]
// CHECK: %h0 = phaze.matmul {{.*}} phaze.layer = 0 : i64
// CHECK: %h1 = phaze.matmul {{.*}} phaze.layer = 1 : i64
// CHECK: %loss = phaze.reduction {{.*}} phaze.layer = 2 : i64
// CHECK: %g = phaze.elementwise {{.*}} phaze.layer = 2 : i64
// CHECK: %t1 = phaze.layout {{.*}} phaze.layer = 1 : i64
// CHECK: %gw0 = phaze.matmul {{.*}} phaze.layer = 0 : i64
