// RUN: phaze-opt %s -p phaze-schedule-ops | filecheck %s
// RUN: phaze-opt %s -p "phaze-schedule-ops{time_limit=5 seed=3}" | filecheck %s
// RUN: sed 's/, phaze.latency = #phaze.latency<[^>]*>//' %s | not phaze-opt -p phaze-schedule-ops 2>&1 | filecheck %s --check-prefix=NOLAT

// The toy chip of tile_pe_array.mlir: 2 tensor cores, 2 vector cores (its details do not
// matter here: only the core counts and the ops' phaze.latency are read).
//
// Layer 0, forward: three independent GEMMs (4 us on one core, 2.5 us split over both) and two
// adds (1 us, splitting does not help): s = a + b, c = s + d.  Splitting everything takes
// 3 * 2.5 + 2 = 9.5 us; the optimum runs a and b side by side on one core each (0-4 us), then d
// split (4-6.5 us) while s runs on a vector core (4-5 us), then c (6.5-7.5 us).  The view takes
// no time and starts when c ends.  Backward: one op, faster split (1 us on both vector cores).
// Layer 1 repeats layer 0's forward on its output (same problem, solved once) and has no
// backward.  Times are from the start of each layer's phase.

builtin.module attributes {phaze.target = @acc} {
  phaze.accelerator @acc {name = "toy", clock_hz = 1.000000e+09 : f64, bytes_per_element = 2 : i64, tensor_cores = {count = 2 : i64, pe_x = 4 : i64, pe_y = 4 : i64, buffer_bytes = 256 : i64}, vector_cores = {count = 2 : i64, width = 4 : i64, buffer_bytes = 64 : i64}, global_buffer = {bytes = 4096 : i64, bandwidth_Bps = 6.400000e+10 : f64}, hbm = {bytes = 1073741824 : i64, bandwidth_Bps = 1.600000e+10 : f64}, network = [{name = "tray", group_size = 4 : i64, bandwidth_Bps = 1.000000e+09 : f64, latency_s = 1.000000e-06 : f64}, {name = "pod", group_size = 64 : i64, bandwidth_Bps = 5.000000e+08 : f64, latency_s = 2.000000e-06 : f64}]}
  func.func @train_step(%x: tensor<8x8xf16>, %w0: tensor<8x8xf16>, %w1: tensor<8x8xf16>, %w2: tensor<8x8xf16>) -> (tensor<8x8xf16>, tensor<8x8xf16>) {
    %a0 = phaze.matmul %x, %w0 {phaze.phase = "fwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 4.0e-06, split_s = 2.5e-06, unit = tensor, bound = compute>} : (tensor<8x8xf16>, tensor<8x8xf16>) -> tensor<8x8xf16>
    %b0 = phaze.matmul %x, %w1 {phaze.phase = "fwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 4.0e-06, split_s = 2.5e-06, unit = tensor, bound = compute>} : (tensor<8x8xf16>, tensor<8x8xf16>) -> tensor<8x8xf16>
    %d0 = phaze.matmul %x, %w2 {phaze.phase = "fwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 4.0e-06, split_s = 2.5e-06, unit = tensor, bound = compute>} : (tensor<8x8xf16>, tensor<8x8xf16>) -> tensor<8x8xf16>
    %s0 = phaze.elementwise "add" %a0, %b0 aten "aten.add.Tensor" {phaze.phase = "fwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 1.0e-06, split_s = 1.0e-06, unit = vector, bound = hbm>} : (tensor<8x8xf16>, tensor<8x8xf16>) -> tensor<8x8xf16>
    %c0 = phaze.elementwise "add" %s0, %d0 aten "aten.add.Tensor" {phaze.phase = "fwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 1.0e-06, split_s = 1.0e-06, unit = vector, bound = hbm>} : (tensor<8x8xf16>, tensor<8x8xf16>) -> tensor<8x8xf16>
    %t0 = phaze.layout "view" %c0 aten "aten.view.default" {phaze.phase = "fwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 0.0, split_s = 0.0, unit = none, bound = none>} : (tensor<8x8xf16>) -> tensor<8x8xf16>
    %a1 = phaze.matmul %t0, %w0 {phaze.phase = "fwd", phaze.layer = 1 : i64, phaze.latency = #phaze.latency<one_s = 4.0e-06, split_s = 2.5e-06, unit = tensor, bound = compute>} : (tensor<8x8xf16>, tensor<8x8xf16>) -> tensor<8x8xf16>
    %b1 = phaze.matmul %t0, %w1 {phaze.phase = "fwd", phaze.layer = 1 : i64, phaze.latency = #phaze.latency<one_s = 4.0e-06, split_s = 2.5e-06, unit = tensor, bound = compute>} : (tensor<8x8xf16>, tensor<8x8xf16>) -> tensor<8x8xf16>
    %d1 = phaze.matmul %t0, %w2 {phaze.phase = "fwd", phaze.layer = 1 : i64, phaze.latency = #phaze.latency<one_s = 4.0e-06, split_s = 2.5e-06, unit = tensor, bound = compute>} : (tensor<8x8xf16>, tensor<8x8xf16>) -> tensor<8x8xf16>
    %s1 = phaze.elementwise "add" %a1, %b1 aten "aten.add.Tensor" {phaze.phase = "fwd", phaze.layer = 1 : i64, phaze.latency = #phaze.latency<one_s = 1.0e-06, split_s = 1.0e-06, unit = vector, bound = hbm>} : (tensor<8x8xf16>, tensor<8x8xf16>) -> tensor<8x8xf16>
    %c1 = phaze.elementwise "add" %s1, %d1 aten "aten.add.Tensor" {phaze.phase = "fwd", phaze.layer = 1 : i64, phaze.latency = #phaze.latency<one_s = 1.0e-06, split_s = 1.0e-06, unit = vector, bound = hbm>} : (tensor<8x8xf16>, tensor<8x8xf16>) -> tensor<8x8xf16>
    %t1 = phaze.layout "view" %c1 aten "aten.view.default" {phaze.phase = "fwd", phaze.layer = 1 : i64, phaze.latency = #phaze.latency<one_s = 0.0, split_s = 0.0, unit = none, bound = none>} : (tensor<8x8xf16>) -> tensor<8x8xf16>
    %g0 = phaze.elementwise "mul" %t0, %t0 aten "aten.mul.Tensor" {phaze.phase = "bwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 2.0e-06, split_s = 1.0e-06, unit = vector, bound = compute>} : (tensor<8x8xf16>, tensor<8x8xf16>) -> tensor<8x8xf16>
    func.return %t1, %g0 : tensor<8x8xf16>, tensor<8x8xf16>
  }
}

// CHECK: phaze.layer_schedule = [#phaze.layer_schedule<index = 0, fwd_s = 7.5e-06, bwd_s = 1.0e-06, opt_s = 0.0, cast_s = 0.0, tp_comm_s = 0.0, status = optimal, gap = 0.0>, #phaze.layer_schedule<index = 1, fwd_s = 7.5e-06, bwd_s = 0.0, opt_s = 0.0, cast_s = 0.0, tp_comm_s = 0.0, status = optimal, gap = 0.0>]
// CHECK: %a0 = {{.*}} phaze.sched = #phaze.sched<start_s = 0.0, end_s = 4.0e-06, cores = 1>
// CHECK: %b0 = {{.*}} phaze.sched = #phaze.sched<start_s = 0.0, end_s = 4.0e-06, cores = 1>
// CHECK: %d0 = {{.*}} phaze.sched = #phaze.sched<start_s = 4.0e-06, end_s = 6.5{{0*[0-9]*}}e-06, cores = 2>
// CHECK: %s0 = {{.*}} phaze.sched = #phaze.sched<start_s = 4.0e-06, end_s = {{(5.0|4.99999*[0-9]*)}}e-06, cores = 1>
// CHECK: %c0 = {{.*}} phaze.sched = #phaze.sched<start_s = 6.5{{0*[0-9]*}}e-06, end_s = 7.5e-06, cores = 1>
// CHECK: %t0 = {{.*}} phaze.sched = #phaze.sched<start_s = 7.5e-06, end_s = 7.5e-06, cores = 0>
// CHECK: %d1 = {{.*}} phaze.sched = #phaze.sched<start_s = 4.0e-06, end_s = 6.5{{0*[0-9]*}}e-06, cores = 2>
// CHECK: %c1 = {{.*}} phaze.sched = #phaze.sched<start_s = 6.5{{0*[0-9]*}}e-06, end_s = 7.5e-06, cores = 1>
// CHECK: %g0 = {{.*}} phaze.sched = #phaze.sched<start_s = 0.0, end_s = 1.0e-06, cores = 2>

// NOLAT: error: 'phaze.matmul' op requires 'phaze.latency'; run phaze-estimate-latency first
