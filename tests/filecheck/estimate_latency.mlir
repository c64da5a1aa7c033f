// RUN: phaze-opt %s -p phaze-tile-pe-array,phaze-estimate-latency | filecheck %s
// RUN: not phaze-opt %s -p phaze-estimate-latency 2>&1 | filecheck %s --check-prefix=NOTILE

// The toy chip of tile_pe_array.mlir: 1 GHz; 2 tensor cores of 4 x 4; 2 vector cores of 4 lanes
// with 64 B buffers; a 4 KiB global buffer at 64 GB/s; HBM at 16 GB/s; a tray of 4 devices at
// 1 GB/s, 1 us and a pod of 64 at 0.5 GB/s, 2 us.  Hand-checked values:
//
// %a  GEMM 16x8x8: 4 tiles of 23 cycles: 92 ns on one core, 46 ns on two (compute-bound: the
//     GLB moves 1024 B (one core) / 768 B (two cores share the A stream) at 64 GB/s = 16 / 12 ns,
//     HBM 640 B at 16 GB/s = 40 ns).
// %e  add of 1024 f16: 256 cycles on one vector core, 128 on two; HBM 6144 B / 16 GB/s = 384 ns.
// %p  softmax of 8 x 64 f32 (5 FLOPs per element, 3 passes): 640 / 320 cycles; a 256 B row does
//     not fit half a 64 B vector buffer, so the GLB is read 3 times: 8192 B / 64 GB/s = 128 ns.
// %t  a view: free.
// %r  ring all-reduce of 2048 B over 4 devices on the tray: 2*3/4 * 2048 / 1e9 + 2*3 * 1e-6.
// %g  all-gather to 4096 B over 8 devices (the pod; 4 in each tray ring over 4 links at once,
//     min(4 * 5e8, 1e9) = 1e9 B/s): 7/8 * 4096 / 1e9 + 7 * 2e-6.
// %n  send/recv of 2048 B: 1e-6 + 2048 / 1e9.
// Layer totals: serial sums of split_s per layer and phase.

builtin.module attributes {phaze.target = @acc} {
  phaze.accelerator @acc {name = "toy", clock_hz = 1.000000e+09 : f64, bytes_per_element = 2 : i64, tensor_cores = {count = 2 : i64, pe_x = 4 : i64, pe_y = 4 : i64, buffer_bytes = 256 : i64}, vector_cores = {count = 2 : i64, width = 4 : i64, buffer_bytes = 64 : i64}, global_buffer = {bytes = 4096 : i64, bandwidth_Bps = 6.400000e+10 : f64}, hbm = {bytes = 1073741824 : i64, bandwidth_Bps = 1.600000e+10 : f64}, network = [{name = "tray", group_size = 4 : i64, bandwidth_Bps = 1.000000e+09 : f64, latency_s = 1.000000e-06 : f64}, {name = "pod", group_size = 64 : i64, bandwidth_Bps = 5.000000e+08 : f64, latency_s = 2.000000e-06 : f64}]}
  func.func @train_step(%x: tensor<16x8xf16>, %w: tensor<8x8xf16>, %u: tensor<1024xf16>, %v: tensor<1024xf16>, %s: tensor<8x64xf32>, %h: tensor<256xf16>) -> (tensor<16x8xf16>, tensor<1024xf16>, tensor<8x64xf32>, tensor<8x16xf16>, tensor<1024xf16>, tensor<2048xf16>, tensor<1024xf16>) {
    %a = phaze.matmul %x, %w {phaze.phase = "fwd", phaze.layer = 0 : i64} : (tensor<16x8xf16>, tensor<8x8xf16>) -> tensor<16x8xf16>
    %e = phaze.elementwise "add" %u, %v aten "aten.add.Tensor" {phaze.phase = "fwd", phaze.layer = 0 : i64} : (tensor<1024xf16>, tensor<1024xf16>) -> tensor<1024xf16>
    %p = phaze.softmax "softmax" %s dim 1 {phaze.phase = "bwd", phaze.layer = 0 : i64} : (tensor<8x64xf32>) -> tensor<8x64xf32>
    %t = phaze.layout "transpose" %a aten "aten.t.default" {phaze.phase = "bwd", phaze.layer = 0 : i64} : (tensor<16x8xf16>) -> tensor<8x16xf16>
    %r = phaze.collective "all_reduce" %u group_size 4 {phaze.phase = "fwd", phaze.layer = 1 : i64} : (tensor<1024xf16>) -> tensor<1024xf16>
    %g = phaze.collective "all_gather" %h group_size 8 {phaze.phase = "fwd", phaze.layer = 1 : i64} : (tensor<256xf16>) -> tensor<2048xf16>
    %n = phaze.collective "send_recv" %u group_size 2 {phaze.phase = "opt", phaze.layer = 1 : i64} : (tensor<1024xf16>) -> tensor<1024xf16>
    func.return %a, %e, %p, %t, %r, %g, %n : tensor<16x8xf16>, tensor<1024xf16>, tensor<8x64xf32>, tensor<8x16xf16>, tensor<1024xf16>, tensor<2048xf16>, tensor<1024xf16>
  }
}

// CHECK: builtin.module attributes {phaze.target = @acc, phaze.layer_latency = [#phaze.layer_latency<index = 0, fwd_s = 4.3e-07, bwd_s = 3.2e-07, opt_s = 0.0>, #phaze.layer_latency<index = 1, fwd_s = 2.6656e-05, bwd_s = 0.0, opt_s = 3.0480000000000003e-06>]}
// CHECK: %a = phaze.matmul {{.*}}phaze.tile = #phaze.tile<{{.*}}>, phaze.latency = #phaze.latency<one_s = 9.2e-08, split_s = 4.6e-08, unit = tensor, bound = compute>
// CHECK: %e = phaze.elementwise {{.*}}phaze.latency = #phaze.latency<one_s = 3.84e-07, split_s = 3.84e-07, unit = vector, bound = hbm>
// CHECK: %p = phaze.softmax {{.*}}phaze.latency = #phaze.latency<one_s = 6.4e-07, split_s = 3.2e-07, unit = vector, bound = compute>
// CHECK: %t = phaze.layout {{.*}}phaze.latency = #phaze.latency<one_s = 0.0, split_s = 0.0, unit = none, bound = none>
// CHECK: %r = phaze.collective {{.*}}phaze.latency = #phaze.latency<one_s = 9.072e-06, split_s = 9.072e-06, unit = network, bound = network>
// CHECK: %g = phaze.collective {{.*}}phaze.latency = #phaze.latency<one_s = 1.7584e-05, split_s = 1.7584e-05, unit = network, bound = network>
// CHECK: %n = phaze.collective {{.*}}phaze.latency = #phaze.latency<one_s = 3.0480000000000003e-06, split_s = 3.0480000000000003e-06, unit = network, bound = network>

// NOTILE: 'phaze.matmul' op requires 'phaze.tile'; run phaze-tile-pe-array first
