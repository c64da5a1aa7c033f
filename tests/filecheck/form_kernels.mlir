// RUN: phaze-opt %s -p 'phaze-form-kernels{runtime=eager}' | filecheck %s --check-prefix=EAGER
// RUN: phaze-opt %s -p 'phaze-form-kernels{runtime=inductor}' | filecheck %s --check-prefix=INDUCTOR
// RUN: phaze-opt %s -p 'phaze-form-kernels{runtime=megatron}' | filecheck %s --check-prefix=MEGATRON
// RUN: phaze-opt %s -p 'phaze-form-kernels{runtime=inductor},phaze-form-kernels{runtime=inductor}' | filecheck %s --check-prefix=INDUCTOR

// A GEMM, a bias-add and GELU chain (pointwise, 2x8 elements), a row softmax (2 rows of 8), and
// a fused attention op's two ops (phaze.fused).  eager: one kernel per op, the fused pair one
// kernel whose score tensor (2x8x8 f16 = 256 bytes) is written and read on chip, and which reads
// q once (its transposed view is the same bytes, already read).  inductor: the
// chain and the softmax after it are one kernel (a pointwise prologue of numel * rnumel = 16
// elements), the GEMM stays a library kernel.  megatron: the pointwise chain and the softmax
// after it fuse too (fused scale-mask-softmax), but a reduction after a reduction does not.
// The view launches nothing and gets no kernel.  Running the pass twice gives the same records.

builtin.module {
  func.func @train_step(%w: tensor<4x8xf16> {phaze.param = "w"}, %b: tensor<8xf16> {phaze.param = "b"}, %x: tensor<2x4xf16> {phaze.input = "x"}, %q: tensor<2x8x4xf16> {phaze.input = "q"}) -> (tensor<f32> {phaze.loss}) {
    %h = phaze.matmul %x, %w {phaze.module = "fc", phaze.phase = "fwd"} : (tensor<2x4xf16>, tensor<4x8xf16>) -> tensor<2x8xf16>
    %hb = phaze.elementwise "add" %h, %b aten "aten.add.Tensor" {phaze.module = "fc", phaze.phase = "fwd"} : (tensor<2x8xf16>, tensor<8xf16>) -> tensor<2x8xf16>
    %g = phaze.elementwise "gelu" %hb aten "aten.gelu.default" {phaze.module = "act", phaze.phase = "fwd"} : (tensor<2x8xf16>) -> tensor<2x8xf16>
    %p = phaze.softmax "softmax" %g dim -1 {phaze.module = "sm", phaze.phase = "fwd"} : (tensor<2x8xf16>) -> tensor<2x8xf16>
    %s = phaze.reduction "sum" %p dims [1] aten "aten.sum.dim_IntList" {phaze.module = "sm", phaze.phase = "fwd"} : (tensor<2x8xf16>) -> tensor<2xf16>
    %v = phaze.layout "view" %s aten "aten.view.default" {phaze.module = "", phaze.phase = "fwd"} : (tensor<2xf16>) -> tensor<2xf16>
    %kt = phaze.layout "transpose" %q aten "attention" {phaze.module = "attn", phaze.phase = "fwd", phaze.fused = "sdpa causal"} : (tensor<2x8x4xf16>) -> tensor<2x4x8xf16>
    %sc = phaze.matmul %q, %kt {phaze.module = "attn", phaze.phase = "fwd", phaze.fused = "sdpa causal"} : (tensor<2x8x4xf16>, tensor<2x4x8xf16>) -> tensor<2x8x8xf16>
    %pr = phaze.softmax "softmax" %sc dim -1 {phaze.module = "attn", phaze.phase = "fwd", phaze.fused = "sdpa causal"} : (tensor<2x8x8xf16>) -> tensor<2x8x8xf16>
    %loss = phaze.reduction "sum" %pr dims [] aten "aten.sum.default" {phaze.module = "", phaze.phase = "fwd"} : (tensor<2x8x8xf16>) -> tensor<f32>
    func.return %loss : tensor<f32>
  }
}

// EAGER: builtin.module attributes {phaze.kernels = "eager"}
// EAGER: %h = phaze.matmul {{.*}}phaze.kernel = #phaze.kernel<id = 0, launch = 1, onchip_read = 0, onchip_written = 0, causal = 0>
// EAGER: %hb = {{.*}}#phaze.kernel<id = 1, launch = 1, onchip_read = 0, onchip_written = 0, causal = 0>
// EAGER: %g = {{.*}}#phaze.kernel<id = 2, launch = 1,
// EAGER: %p = {{.*}}#phaze.kernel<id = 3, launch = 1,
// EAGER: %s = {{.*}}#phaze.kernel<id = 4, launch = 1,
// EAGER: %v = phaze.layout "view"
// EAGER-NOT: phaze.kernel
// EAGER-SAME: -> tensor<2xf16>
// EAGER: %kt = phaze.layout "transpose"
// EAGER-NOT: phaze.kernel
// EAGER-SAME: -> tensor<2x4x8xf16>
// EAGER: %sc = {{.*}}#phaze.kernel<id = 7, launch = 1, onchip_read = 128, onchip_written = 256, causal = 1>
// EAGER: %pr = {{.*}}#phaze.kernel<id = 7, launch = 0, onchip_read = 256, onchip_written = 0, causal = 1>
// EAGER: %loss = {{.*}}#phaze.kernel<id = 9, launch = 1,

// INDUCTOR: builtin.module attributes {phaze.kernels = "inductor"}
// INDUCTOR: %h = phaze.matmul {{.*}}#phaze.kernel<id = 0, launch = 1, onchip_read = 0, onchip_written = 0, causal = 0>
// INDUCTOR: %hb = {{.*}}#phaze.kernel<id = 1, launch = 1, onchip_read = 0, onchip_written = 32, causal = 0>
// INDUCTOR: %g = {{.*}}#phaze.kernel<id = 1, launch = 0, onchip_read = 32, onchip_written = 32, causal = 0>
// INDUCTOR: %p = {{.*}}#phaze.kernel<id = 1, launch = 0, onchip_read = 32, onchip_written = 32, causal = 0>
// INDUCTOR: %s = {{.*}}#phaze.kernel<id = 1, launch = 0, onchip_read = 32, onchip_written = 0, causal = 0>

// MEGATRON: builtin.module attributes {phaze.kernels = "megatron"}
// MEGATRON: %hb = {{.*}}#phaze.kernel<id = 1, launch = 1, onchip_read = 0, onchip_written = 32, causal = 0>
// MEGATRON: %g = {{.*}}#phaze.kernel<id = 1, launch = 0, onchip_read = 32, onchip_written = 32, causal = 0>
// MEGATRON: %p = {{.*}}#phaze.kernel<id = 1, launch = 0, onchip_read = 32, onchip_written = 0, causal = 0>
// MEGATRON: %s = {{.*}}#phaze.kernel<id = 4, launch = 1, onchip_read = 0, onchip_written = 0, causal = 0>
