// RUN: sed 's/, phaze.latency = #phaze.latency<[^>]*>//' %s | phaze-opt -p phaze-overlap-tensor-parallel | filecheck %s
// RUN: sed 's/, phaze.latency = #phaze.latency<[^>]*>//' %s | phaze-opt -p phaze-overlap-tensor-parallel | not phaze-opt -p phaze-overlap-tensor-parallel 2>&1 | filecheck %s --check-prefix=TWICE
// RUN: sed 's/, phaze.latency = #phaze.latency<[^>]*>//' %s | sed 's/phaze.tp_width = 2 : i64, //' | phaze-opt -p phaze-overlap-tensor-parallel | filecheck %s --check-prefix=NOTP
// RUN: sed 's/, phaze.latency = #phaze.latency<[^>]*>//' %s | sed 's/, phaze.sequence_parallel//' | not phaze-opt -p phaze-overlap-tensor-parallel 2>&1 | filecheck %s --check-prefix=NOSP
// RUN: sed 's/, phaze.latency = #phaze.latency<[^>]*>//' %s | sed 's/, calibration = {[^}]*}//' | not phaze-opt -p phaze-overlap-tensor-parallel 2>&1 | filecheck %s --check-prefix=NOSMS
// RUN: not phaze-opt %s -p phaze-overlap-tensor-parallel 2>&1 | filecheck %s --check-prefix=PRICED

// The toy chip of tile_pe_array.mlir with 32 SMs ([calibration] wave_units), a step sharded
// over TP width 2 with sequence parallelism; one layer.  phaze-overlap-tensor-parallel marks the
// module phaze.tp_overlap (the latencies, stripped by the sed of the RUN lines, are
// phaze-estimate-latency's to write, which prices each overlapped collective at what it adds to
// its GEMMs).  Worked by hand from the latencies written below (tests/test_tp_overlap.py,
// test_overlap_worked_by_hand), Transformer Engine's methods
// (passes/algorithms/tp_overlap.py): a hop of r beside a GEMM step of x ends at
// max(r, x + f min(r, x)), f the share of the SMs the collective holds; where TE sets an SM
// margin (pipeline, bulk) every GEMM step runs on the SMs less the collective's, x / (1 - f),
// and a hop beside it ends at max(r, x / (1 - f)).
//   %ag  forward all-gather (2 us) of the input of %a (4 us, reads the weight %w; through a
//        view): ring exchange, t = 2 chunks of 2 us, one hop of 2 us, f = 1/32:
//        2 + max(2, 2 + 2/32) - 4 = 0.0625 us added.  It hides 1.9375 us of %a.
//   %rs  forward reduce-scatter (2 us) of %b's output (4 us): pipeline, 4 chunks of 1 us on 16 of
//        the 32 SMs (2 us each), 4 hops of 0.5 us, the last alone, f = 16/32:
//        2 + 3 max(0.5, 2) + 0.5 - 4 = 4.5 us.
//   %bg  backward all-gather (2 us) of the saved input, read by the weight-gradient GEMM %dw
//        (1 us, no weight operand): bulk, f = 16/32: max(2, 1 / 0.5) - 1 = 1 us.
//   %ar  an all-reduce (TE overlaps none): unchanged.
// phaze.layer_latency: forward 0.0625 + 4 + 4 + 4.5 = 12.5625 us; backward 1 + 1 + 3 = 5 us.

builtin.module attributes {phaze.target = @acc, phaze.tp_width = 2 : i64, phaze.sequence_parallel} {
  phaze.accelerator @acc {name = "toy", clock_hz = 1.000000e+09 : f64, bytes_per_element = 2 : i64, tensor_cores = {count = 2 : i64, pe_x = 4 : i64, pe_y = 4 : i64, buffer_bytes = 256 : i64}, vector_cores = {count = 2 : i64, width = 4 : i64, buffer_bytes = 64 : i64}, global_buffer = {bytes = 4096 : i64, bandwidth_Bps = 6.400000e+10 : f64}, hbm = {bytes = 1073741824 : i64, bandwidth_Bps = 1.600000e+10 : f64}, calibration = {wave_tile_m = 4 : i64, wave_tile_n = 4 : i64, wave_units = 32 : i64}, network = [{name = "tray", group_size = 4 : i64, bandwidth_Bps = 1.000000e+09 : f64, latency_s = 1.000000e-06 : f64}, {name = "pod", group_size = 64 : i64, bandwidth_Bps = 5.000000e+08 : f64, latency_s = 2.000000e-06 : f64}]}
  func.func @train_step(%x: tensor<2x8xf16> {phaze.input = "x"}, %w: tensor<8x8xf16> {phaze.param = "w"}, %w2: tensor<8x8xf16> {phaze.param = "w2"}, %dy: tensor<4x8xf16>) -> (tensor<2x8xf16>, tensor<8x8xf16>, tensor<4x8xf16>) {
    %ag = phaze.collective "all_gather" %x group_size 2 {phaze.phase = "fwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 2.0e-06, split_s = 2.0e-06, unit = network, bound = network>} : (tensor<2x8xf16>) -> tensor<4x8xf16>
    %v = phaze.layout "view" %ag aten "aten.view.default" {phaze.phase = "fwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 0.0, split_s = 0.0, unit = none, bound = none>} : (tensor<4x8xf16>) -> tensor<4x8xf16>
    %a = phaze.matmul %v, %w {phaze.phase = "fwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 8.0e-06, split_s = 4.0e-06, unit = tensor, bound = compute>} : (tensor<4x8xf16>, tensor<8x8xf16>) -> tensor<4x8xf16>
    %b = phaze.matmul %a, %w2 {phaze.phase = "fwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 8.0e-06, split_s = 4.0e-06, unit = tensor, bound = compute>} : (tensor<4x8xf16>, tensor<8x8xf16>) -> tensor<4x8xf16>
    %rs = phaze.collective "reduce_scatter" %b group_size 2 {phaze.phase = "fwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 2.0e-06, split_s = 2.0e-06, unit = network, bound = network>} : (tensor<4x8xf16>) -> tensor<2x8xf16>
    %bg = phaze.collective "all_gather" %x group_size 2 {phaze.phase = "bwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 2.0e-06, split_s = 2.0e-06, unit = network, bound = network>} : (tensor<2x8xf16>) -> tensor<4x8xf16>
    %bt = phaze.layout "transpose" %bg aten "aten.t.default" {phaze.phase = "bwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 0.0, split_s = 0.0, unit = none, bound = none>} : (tensor<4x8xf16>) -> tensor<8x4xf16>
    %dw = phaze.matmul %bt, %dy {phaze.phase = "bwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 2.0e-06, split_s = 1.0e-06, unit = tensor, bound = compute>} : (tensor<8x4xf16>, tensor<4x8xf16>) -> tensor<8x8xf16>
    %ar = phaze.collective "all_reduce" %dy group_size 2 {phaze.phase = "bwd", phaze.layer = 0 : i64, phaze.latency = #phaze.latency<one_s = 3.0e-06, split_s = 3.0e-06, unit = network, bound = network>} : (tensor<4x8xf16>) -> tensor<4x8xf16>
    func.return %rs, %dw, %ar : tensor<2x8xf16>, tensor<8x8xf16>, tensor<4x8xf16>
  }
}

// CHECK: builtin.module attributes {phaze.target = @acc, phaze.tp_width = 2 : i64, phaze.sequence_parallel, phaze.tp_overlap} {
// CHECK-NOT: phaze.latency
// CHECK: func.return

// Without TP (width 1) there is nothing to overlap: the module is left as it is.
// NOTP: builtin.module attributes {phaze.target = @acc, phaze.sequence_parallel} {

// TWICE: phaze-overlap-tensor-parallel: the module is priced with TP overlap already: compile the step again to price it without
// NOSP: phaze-overlap-tensor-parallel: TP overlap runs on sequence parallelism's all-gathers and reduce-scatters; the step is sharded without it (phaze-shard-tensor-parallel{sequence_parallel=true})
// NOSMS: phaze-overlap-tensor-parallel: chip 'toy' has no SM count ([calibration] wave_units): TP overlap is priced by the SMs Transformer Engine's communication kernels hold
// PRICED: phaze-overlap-tensor-parallel: the module's ops are priced already (phaze.latency); run it before phaze-estimate-latency, which prices what it marks
