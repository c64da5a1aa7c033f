// RUN: sed 's/, phaze.latency = #phaze.latency<[^>]*>//' %s | phaze-opt -p "phaze-context-parallel{degree=2}" | filecheck %s
// RUN: sed 's/, phaze.latency = #phaze.latency<[^>]*>//' %s | phaze-opt -p "phaze-context-parallel{degree=1}" | filecheck %s --check-prefix=ONE
// RUN: sed 's/, phaze.latency = #phaze.latency<[^>]*>//' %s | phaze-opt -p "phaze-context-parallel{degree=2}" | not phaze-opt -p "phaze-context-parallel{degree=2}" 2>&1 | filecheck %s --check-prefix=TWICE
// RUN: sed 's/, phaze.latency = #phaze.latency<[^>]*>//' %s | sed 's/phaze.fused = "attn[a-z0-9_]*", //' | not phaze-opt -p "phaze-context-parallel{degree=2}" 2>&1 | filecheck %s --check-prefix=NOFUSED
// RUN: not phaze-opt %s -p "phaze-context-parallel{degree=0}" 2>&1 | filecheck %s --check-prefix=DEGREE
// RUN: not phaze-opt %s -p "phaze-context-parallel{degree=2}" 2>&1 | filecheck %s --check-prefix=PRICED
// RUN: sed 's/, phaze.latency = #phaze.latency<[^>]*>//' %s | phaze-opt -p "phaze-context-parallel{degree=2},phaze-tile-pe-array,phaze-estimate-latency" | filecheck %s --check-prefix=RING
// RUN: sed 's/, phaze.latency = #phaze.latency<[^>]*>//' %s | phaze-opt -p "phaze-context-parallel{degree=2},phaze-tile-pe-array,phaze-estimate-latency" | phaze-opt -p phaze-estimate-latency | filecheck %s --check-prefix=RING

// The toy chip of tile_pe_array.mlir (tray: 4 devices, 1 GB/s, 1 us; no collective_compute_share).
// One layer, no TP: a fused attention forward (s = q kT, p = softmax(s), o = p v) and its
// backward (two GEMMs), and a GEMM outside the kernel.  phaze-context-parallel marks the module
// (its latencies, stripped by the sed of the RUN lines, are phaze-estimate-latency's to write):
// phaze.context_parallel = 2, and nothing else of the module's: phaze.seq_len and
// phaze.model_flops stay the importer's, as traced (S/c).  The whole sample's are read from them
// (phaze_ir.keys.sample_seq_len: 4 -> 8; sample_model_flops, tests/test_context_parallel.py:
// phaze.model_flops 10000 of which phaze.attention_flops, the attention's forward GEMMs
// 2*4*4*8 + 2*4*8*4 = 512 three times (forward and backward), is 1536; the rest scales by c,
// attention by c^2: 2 * (10000 - 1536) + 4 * 1536 = 23072).
// phaze-estimate-latency then prices each attention as a ring of 2 steps (the ring worked by hand
// from the latencies written below: tests/test_context_parallel.py, test_the_ring_worked_by_hand).
// On this toy chip a step takes tens of ns and a hop of K and V (twice kT's 8 x 4 f16 = 128 B)
// 1e-6 + 128 / 1e9 = 1.128 us: the hops set the pace.  TE's memory-bound passes around the
// steps move their bytes at the HBM's 16 GB/s (Q and O 64 B, K and V 128 B; a copy reads and
// writes, an add reads two).  Forward: K, V into the send buffer (16 ns), the diagonal step
// beside the hop, the off-diagonal one (36 ns) with its halves of K and V made contiguous
// (8 ns), then the two partial outputs merged (8 + 12 ns): 1.208 us.  Backward (Transformer
// Engine's order): K, V into the send buffer (16 ns), each step beside a hop, K and V then their
// gradients (2 x 1.128 us, the passes beside them hidden), the first step's dK, dV copied
// (16 ns) and the diagonal's added (24 ns) once they arrive: 2.312 us.
// Priced again, the module is the same (the ring is the pricing's, not a later pass's).

builtin.module attributes {phaze.target = @acc, phaze.seq_len = 4 : i64, phaze.model_flops = 10000 : i64, phaze.attention_flops = 1536 : i64} {
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

// CHECK: builtin.module attributes {phaze.target = @acc, phaze.seq_len = 4 : i64, phaze.model_flops = 10000 : i64, phaze.attention_flops = 1536 : i64, phaze.context_parallel = 2 : i64} {
// CHECK-NOT: phaze.latency
// CHECK: func.return

// RING: builtin.module attributes {phaze.target = @acc, phaze.seq_len = 4 : i64, phaze.model_flops = 10000 : i64, phaze.attention_flops = 1536 : i64, phaze.context_parallel = 2 : i64, phaze.layer_latency = [#phaze.layer_latency<index = 0, fwd_s = 1.224e-06, bwd_s = 2.312e-06, opt_s = 0.0>], phaze.cp_ring = {fwd_step_s = 5.800000e-08 : f64, fwd_hop_s = 1.128000e-06 : f64, fwd_ring_s = 1.208000e-06 : f64, bwd_step_s = 6.800000e-08 : f64, bwd_hop_s = 2.256000e-06 : f64, bwd_ring_s = 2.312000e-06 : f64, kv_bytes = 128 : i64}} {

// Degree 1 is the step as traced: nothing written.
// ONE: builtin.module attributes {phaze.target = @acc, phaze.seq_len = 4 : i64, phaze.model_flops = 10000 : i64, phaze.attention_flops = 1536 : i64} {
// ONE-NOT: phaze.context_parallel

// TWICE: phaze-context-parallel: the module is priced for context parallelism already (its attention and FLOPs are scaled): compile the step again to price another degree
// NOFUSED: phaze-context-parallel: context parallelism 2 needs a fused attention (SDPA, flash attention): the step has none; build the model with attn_implementation='sdpa'
// DEGREE: phaze-context-parallel: degree=0: expected a context-parallel degree >= 1
// PRICED: phaze-context-parallel: the module's ops are priced already (phaze.latency); run it before phaze-estimate-latency, which prices what it marks
