// RUN: phaze-opt %s -p phaze-insert-optimizer | filecheck %s
// RUN: phaze-opt %s -p 'phaze-insert-optimizer{optimizer=sgd}' | filecheck %s --check-prefix=SGD
// RUN: not phaze-opt %s -p phaze-insert-optimizer,phaze-insert-optimizer 2>&1 | filecheck %s --check-prefix=TWICE

// One optimizer update per returned gradient; the updated parameters are returned too.

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

// CHECK: -> (tensor<f32> {phaze.loss}, tensor<4x4xf16> {phaze.grad = "blocks.0.w"}, tensor<4x4xf16> {phaze.grad = "blocks.1.w"}, tensor<4x4xf16> {phaze.updated = "blocks.0.w"}, tensor<4x4xf16> {phaze.updated = "blocks.1.w"})
// CHECK: %updated = phaze.optimizer_update "adam" %blocks.0.w, %gw0 state_bytes 12 {phaze.phase = "opt", phaze.module = "blocks.0"}
// CHECK-NEXT: %updated_1 = phaze.optimizer_update "adam" %blocks.1.w, %gw1 state_bytes 12 {phaze.phase = "opt", phaze.module = "blocks.1"}
// CHECK-NEXT: func.return %loss, %gw0, %gw1, %updated, %updated_1

// SGD: phaze.optimizer_update "sgd" %blocks.0.w, %gw0 state_bytes 4

// TWICE: phaze-opt: error: phaze-insert-optimizer: the step already has optimizer updates
