// RUN: phaze-opt %s | filecheck %s
// RUN: phaze-opt %s --print-op-generic | phaze-opt | filecheck %s
// RUN: phaze-opt %s --print-op-generic | filecheck %s --check-prefix=GENERIC

// Every op of the dialect prints in its custom form and parses back, directly and from the
// generic form.

builtin.module attributes {phaze.layers = [#phaze.layer_info<index = 0, kind = block, module = "h.0", same_as = 0, param_bytes = 1, saved_bytes = 2, boundary_bytes = 3, grad_boundary_bytes = 3, fwd_flops = 5, bwd_flops = 10, opt_flops = 7, num_ops = 8, experts = 0, dispatch_bytes = 0>]} {
  phaze.accelerator @acc {clock_hz = 1.050000e+09 : f64}
  func.func @train_step(%x: tensor<8x64xf16> {phaze.input = "x"}, %w: tensor<64x32xf16> {phaze.param = "w"}, %b: tensor<32xf16> {phaze.param = "b"}, %ids: tensor<8xi64> {phaze.input = "ids"}) -> (tensor<f32> {phaze.loss}) {
    %y = phaze.matmul %x, %w, %b {phaze.phase = "fwd"} : (tensor<8x64xf16>, tensor<64x32xf16>, tensor<32xf16>) -> tensor<8x32xf16>
    %z = phaze.elementwise "gelu" %y aten "aten.gelu.default" : (tensor<8x32xf16>) -> tensor<8x32xf16>
    %f = phaze.elementwise "fill" aten "aten.zeros.default" : () -> tensor<8x32xf16>
    %s = phaze.reduction "sum" %z dims [0] aten "aten.sum.dim_IntList" : (tensor<8x32xf16>) -> tensor<32xf16>
    %p = phaze.softmax "softmax" %z dim -1 : (tensor<8x32xf16>) -> tensor<8x32xf16>
    %n, %m, %r = phaze.norm "layer_norm" %z, %b, %b normalized_rank 1 : (tensor<8x32xf16>, tensor<32xf16>, tensor<32xf16>) -> (tensor<8x32xf16>, tensor<8x1xf32>, tensor<8x1xf32>)
    %e = phaze.embedding "lookup" %w, %ids : (tensor<64x32xf16>, tensor<8xi64>) -> tensor<8x32xf16>
    %t = phaze.layout "transpose" %z aten "aten.t.default" : (tensor<8x32xf16>) -> tensor<32x8xf16>
    %c = phaze.collective "all_reduce" %z group_size 8 : (tensor<8x32xf16>) -> tensor<8x32xf16>
    %u = phaze.optimizer_update "adam" %w, %w state_bytes 12 : (tensor<64x32xf16>, tensor<64x32xf16>) -> tensor<64x32xf16>
    %o = phaze.opaque "aten.special_i0.default" %z : (tensor<8x32xf16>) -> tensor<8x32xf16>
    %l = phaze.reduction "sum" %z dims [] aten "aten.sum.default" : (tensor<8x32xf16>) -> tensor<f32>
    func.return %l : tensor<f32>
  }
}

// CHECK: builtin.module attributes {phaze.layers = [#phaze.layer_info<index = 0, kind = block, module = "h.0", same_as = 0, param_bytes = 1, saved_bytes = 2, boundary_bytes = 3, grad_boundary_bytes = 3, fwd_flops = 5, bwd_flops = 10, opt_flops = 7, num_ops = 8, experts = 0, dispatch_bytes = 0>]} {
// CHECK-NEXT: phaze.accelerator @acc {clock_hz = 1.050000e+09 : f64}
// CHECK: %y = phaze.matmul %x, %w, %b {phaze.phase = "fwd"} : (tensor<8x64xf16>, tensor<64x32xf16>, tensor<32xf16>) -> tensor<8x32xf16>
// CHECK-NEXT: %z = phaze.elementwise "gelu" %y aten "aten.gelu.default" : (tensor<8x32xf16>) -> tensor<8x32xf16>
// CHECK-NEXT: %f = phaze.elementwise "fill" aten "aten.zeros.default" : () -> tensor<8x32xf16>
// CHECK-NEXT: %s = phaze.reduction "sum" %z dims [0] aten "aten.sum.dim_IntList" : (tensor<8x32xf16>) -> tensor<32xf16>
// CHECK-NEXT: %p = phaze.softmax "softmax" %z dim -1 : (tensor<8x32xf16>) -> tensor<8x32xf16>
// CHECK-NEXT: %n, %m, %r = phaze.norm "layer_norm" %z, %b, %b normalized_rank 1
// CHECK-NEXT: %e = phaze.embedding "lookup" %w, %ids
// CHECK-NEXT: %t = phaze.layout "transpose" %z aten "aten.t.default"
// CHECK-NEXT: %c = phaze.collective "all_reduce" %z group_size 8
// CHECK-NEXT: %u = phaze.optimizer_update "adam" %w, %w state_bytes 12
// CHECK-NEXT: %o = phaze.opaque "aten.special_i0.default" %z
// CHECK-NEXT: %l = phaze.reduction "sum" %z dims [] aten "aten.sum.default"
// CHECK-NEXT: func.return %l : tensor<f32>

// GENERIC: "phaze.matmul"(%x, %w, %b) {phaze.phase = "fwd"} : (tensor<8x64xf16>, tensor<64x32xf16>, tensor<32xf16>) -> tensor<8x32xf16>
// GENERIC: "phaze.elementwise"(%y) <{kind = "gelu", aten = "aten.gelu.default"}>
// GENERIC: "phaze.reduction"(%z) <{kind = "sum", dims = array<i64: 0>, aten = "aten.sum.dim_IntList"}>
