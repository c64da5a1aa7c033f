// RUN: phaze-opt %s -p "phaze-context-parallel{degree=2}" | filecheck %s
// RUN: phaze-opt %s -p "phaze-context-parallel{degree=1}" | filecheck %s --check-prefix=ONE
// RUN: phaze-opt %s -p "phaze-context-parallel{degree=2}" | not phaze-opt -p "phaze-context-parallel{degree=2}" 2>&1 | filecheck %s --check-prefix=TWICE
// RUN: sed 's/phaze.fused = "attn[a-z0-9_]*", //' %s | not phaze-opt -p "phaze-context-parallel{degree=2}" 2>&1 | filecheck %s --check-prefix=NOFUSED
// RUN: not phaze-opt %s -p "phaze-context-parallel{degree=0}" 2>&1 | filecheck %s --check-prefix=DEGREE

// The toy chip of tile_pe_array.mlir (tray: 4 devices, 1 GB/s, 1 us; no collective_compute_share).
// One layer, no TP: a fused attention forward (s = q kT, p = softmax(s), o = p v; 1 us each) and
// its backward (two ops of 0.5 us each), and a GEMM outside the kernel (untouched).
// Degree c = 2, a ring of 2 devices on the tray.  The keys and values one hop carries: twice
// kT's 8 x 4 f16 = 128 B.
//   forward:  local 3 us; hop 1e-6 + 128 / 1e9 = 1.128 us, shorter than a step: the ring is
//             3 + max(1.128, 3) = 6 us, every op of the kernel x 2.
//   backward (Transformer Engine's order, c = 2: the off-diagonal step, then the diagonal): local
//             1 us a step; beside the first, K and V go on (128 B: 1.128 us), beside the last
//             their gradients come back (as many bytes: 1.128 us), each longer than its step: the
//             ring is 2 x max(1.128, 1) = 2.256 us, every op x 2.256; its hops 2.256 us in all.
// phaze.layer_latency: forward 6 + 1 (the outside GEMM) = 7 us, backward 2.256 us.
// phaze.seq_len 4 -> 8.  phaze.model_flops 10000: the attention's forward GEMMs, 2*4*4*8 +
// 2*4*8*4 = 512, three times (forward and backward) is 1536; the rest scales by c, attention by
// c^2: 2 * (10000 - 1536) + 4 * 1536 = 23072.

builtin.module attributes {phaze.target = @acc, phaze.seq_len = 4 : i64, phaze.model_flops = 10000 : i64} {
  phaze.accelerator @acc {name = "toy", clock_hz = 1.000000e+09 : f64, bytes_per_element = 2 : i64, tensor_cores = {count = 2 : i64, pe_x = 4 : i64, pe_y = 4 : i64, buffer_bytes = 256 : i64}, vector_cores = {count = 2 : i64, width = 4 : i64, buffer_bytes = 64 : i64}, global_buffer = {bytes = 4096 : i64, bandwidth_Bps = 6.400000e+10 : f64}, hbm = {bytes = 1073741824 : i64, bandwidth_Bps = 1.600000e+10 : f64}, network = [{name = "tray", group_size = 4 : i64, bandwidth_Bps = 1.000000e+09 : f64, latency_s = 1.000000e-06 : f64}, {name = "pod", group_size = 64 : i64, bandwidth_Bps = 5.000000e+08 : f64, latency_s = 2.000000e-06 : f64}]}
  func.func @train_step(%x: tensor<4x8xf16>, %q: tensor<4x8xf16>, %kt: tensor<8x4xf16>, %v: tensor<4x8xf16>, %w: tensor<8x8xf16>) -> (tensor<4x8xf16>, tensor<4x4xf16>, tensor<4x8xf16>) {
    %s = phaze.matmul %q, %kt {phaze.fused = "attn0", phaze.phase = "fwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 2.0e-06, split_s = 1.0e-06, unit = tensor, bound = compute>} : (tensor<4x8xf16>, tensor<8x4xf16>) -> tensor<4x4xf16>
    %p = phaze.softmax "softmax" %s dim 1 {phaze.fused = "attn0", phaze.phase = "fwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 1.0e-06, split_s = 1.0e-06, unit = vector, bound = compute>} : (tensor<4x4xf16>) -> tensor<4x4xf16>
    %o = phaze.matmul %p, %v {phaze.fused = "attn0", phaze.phase = "fwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 2.0e-06, split_s = 1.0e-06, unit = tensor, bound = compute>} : (tensor<4x4xf16>, tensor<4x8xf16>) -> tensor<4x8xf16>
    %y = phaze.matmul %x, %w {phaze.phase = "fwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 2.0e-06, split_s = 1.0e-06, unit = tensor, bound = compute>} : (tensor<4x8xf16>, tensor<8x8xf16>) -> tensor<4x8xf16>
    %ds = phaze.matmul %o, %kt {phaze.fused = "attn0_bwd", phaze.phase = "bwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 1.0e-06, split_s = 5.0e-07, unit = tensor, bound = compute>} : (tensor<4x8xf16>, tensor<8x4xf16>) -> tensor<4x4xf16>
    %dq = phaze.matmul %ds, %v {phaze.fused = "attn0_bwd", phaze.phase = "bwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 1.0e-06, split_s = 5.0e-07, unit = tensor, bound = compute>} : (tensor<4x4xf16>, tensor<4x8xf16>) -> tensor<4x8xf16>
    func.return %y, %ds, %dq : tensor<4x8xf16>, tensor<4x4xf16>, tensor<4x8xf16>
  }
}

// CHECK: builtin.module attributes {phaze.target = @acc, phaze.seq_len = 8 : i64, phaze.model_flops = 23072 : i64, phaze.layer_latency = [#phaze.layer_latency<index = 0, fwd_s = 7.0e-06, bwd_s = 2.256e-06, opt_s = 0.0>], phaze.context_parallel = 2 : i64, phaze.cp_ring = {fwd_step_s = 3.000000e-06 : f64, fwd_hop_s = 1.128000e-06 : f64, fwd_ring_s = 6.000000e-06 : f64, bwd_step_s = 1.000000e-06 : f64, bwd_hop_s = 2.256000e-06 : f64, bwd_ring_s = 2.256000e-06 : f64, kv_bytes = 128 : i64}}
// CHECK: %s = phaze.matmul {{.*}}phaze.latency = #phaze.latency<one_s = 4.0e-06, split_s = 2.0e-06, unit = tensor, bound = compute>
// CHECK: %p = phaze.softmax {{.*}}phaze.latency = #phaze.latency<one_s = 2.0e-06, split_s = 2.0e-06, unit = vector, bound = compute>
// CHECK: %o = phaze.matmul {{.*}}phaze.latency = #phaze.latency<one_s = 4.0e-06, split_s = 2.0e-06, unit = tensor, bound = compute>
// CHECK: %y = phaze.matmul {{.*}}phaze.latency = #phaze.latency<one_s = 2.0e-06, split_s = 1.0e-06, unit = tensor, bound = compute>
// CHECK: %ds = phaze.matmul {{.*}}phaze.latency = #phaze.latency<one_s = 2.256e-06, split_s = 1.128e-06, unit = tensor, bound = compute>
// CHECK: %dq = phaze.matmul {{.*}}phaze.latency = #phaze.latency<one_s = 2.256e-06, split_s = 1.128e-06, unit = tensor, bound = compute>

// Degree 1 is the step as traced: nothing written.
// ONE: builtin.module attributes {phaze.target = @acc, phaze.seq_len = 4 : i64, phaze.model_flops = 10000 : i64} {
// ONE-NOT: phaze.context_parallel
// ONE: %s = phaze.matmul {{.*}}phaze.latency = #phaze.latency<one_s = 2.0e-06, split_s = 1.0e-06, unit = tensor, bound = compute>

// TWICE: phaze-context-parallel: the module is priced for context parallelism already (its attention, tokens and FLOPs are scaled): compile the step again to price another degree
// NOFUSED: phaze-context-parallel: context parallelism 2 needs a fused attention (SDPA, flash attention): the step has none; build the model with attn_implementation='sdpa'
// DEGREE: phaze-context-parallel: degree=0: expected a context-parallel degree >= 1
