// RUN: phaze-opt %s -p phaze-tile-pe-array,phaze-estimate-energy | filecheck %s
// RUN: sed 's/, energy = {[^}]*}[^}]*}//' %s | not phaze-opt -p phaze-tile-pe-array,phaze-estimate-energy 2>&1 | filecheck %s --check-prefix=NOENERGY
// RUN: not phaze-opt %s -p phaze-estimate-energy 2>&1 | filecheck %s --check-prefix=NOTILE
// RUN: not phaze-opt %s -p 'phaze-tile-pe-array,phaze-estimate-energy{selective="bogus"}' 2>&1 | filecheck %s --check-prefix=BADSEL

// The toy chip of estimate_latency.mlir (the same GEMM, add and all-reduce, tiled alike) with an
// [energy] table: 1 pJ per MAC and per vector lane op, HBM 10 pJ/B, the tray 100 pJ/B, SRAM
// 0.1 pJ/B at 64 B and 0.7 pJ/B at 4 KiB, linear in log2 of the size between: 0.1 pJ/B for a
// vector core's 64 B buffer, 0.3 pJ/B for a tensor core's 256 B, 0.7 pJ/B for the 4 KiB global
// buffer; no energy for the accumulators.  Hand-checked values:
//
// %a  GEMM 16x8x8 tiled 4 x 4: 4 tiles x 2 passes over K, 8 rows a pass: 8 * 8 * 16 = 1024 MACs
//     (1.024 nJ); per pass 8 x 4 of A and 4 x 4 of B, f16, written and read: 2 * 8 * 96 = 1536 B
//     at 0.3 pJ/B (0.4608 nJ); the global buffer's 768 B of estimate_latency.mlir at 0.7 pJ/B
//     (0.5376 nJ); HBM 640 B at 10 pJ/B (6.4 nJ).
// %t  a view: nothing.
// %e  add of 1024 f16: 1024 lane ops (1.024 nJ); 6144 B through a vector core's buffer
//     (0.6144 nJ) and the global buffer (4.3008 nJ); 6144 B of HBM (61.44 nJ).
// %r  ring all-reduce of 2048 B over 4 devices: each sends 2 * 3/4 * 2048 = 3072 B over the
//     tray (307.2 nJ), read from and written to HBM (2 * 3072 B: 61.44 nJ).
// phaze.layer_energy: layer 0 forward 8.4224 nJ (full recompute: the forward again; selective:
// no attention core, 0), backward 67.3792 nJ; layer 1 backward 368.64 nJ, 307.2 nJ of it the
// network's.

builtin.module attributes {phaze.target = @acc} {
  phaze.accelerator @acc {name = "toy", clock_hz = 1.000000e+09 : f64, bytes_per_element = 2 : i64, tensor_cores = {count = 2 : i64, pe_x = 4 : i64, pe_y = 4 : i64, buffer_bytes = 256 : i64}, vector_cores = {count = 2 : i64, width = 4 : i64, buffer_bytes = 64 : i64}, global_buffer = {bytes = 4096 : i64, bandwidth_Bps = 6.400000e+10 : f64}, hbm = {bytes = 1073741824 : i64, bandwidth_Bps = 1.600000e+10 : f64}, energy = {mac_j = 1.000000e-12 : f64, vector_op_j = 1.000000e-12 : f64, sram_j_per_byte = {"64" = 1.000000e-13 : f64, "4096" = 7.000000e-13 : f64}, hbm_j_per_byte = 1.000000e-11 : f64, static_w_per_mm2 = 0.000000e+00 : f64, accumulator_j_per_byte = 0.000000e+00 : f64}, network = [{name = "tray", group_size = 4 : i64, bandwidth_Bps = 1.000000e+09 : f64, latency_s = 1.000000e-06 : f64, energy_j_per_byte = 1.000000e-10 : f64}, {name = "pod", group_size = 64 : i64, bandwidth_Bps = 5.000000e+08 : f64, latency_s = 2.000000e-06 : f64}]}
  func.func @train_step(%x: tensor<16x8xf16>, %w: tensor<8x8xf16>, %u: tensor<1024xf16>, %v: tensor<1024xf16>) -> (tensor<8x16xf16>, tensor<1024xf16>, tensor<1024xf16>) {
    %a = phaze.matmul %x, %w {phaze.phase = "fwd", phaze.layer = 0 : i64} : (tensor<16x8xf16>, tensor<8x8xf16>) -> tensor<16x8xf16>
    %t = phaze.layout "transpose" %a aten "aten.t.default" {phaze.phase = "fwd", phaze.layer = 0 : i64} : (tensor<16x8xf16>) -> tensor<8x16xf16>
    %e = phaze.elementwise "add" %u, %v aten "aten.add.Tensor" {phaze.phase = "bwd", phaze.layer = 0 : i64} : (tensor<1024xf16>, tensor<1024xf16>) -> tensor<1024xf16>
    %r = phaze.collective "all_reduce" %u group_size 4 {phaze.phase = "bwd", phaze.layer = 1 : i64} : (tensor<1024xf16>) -> tensor<1024xf16>
    func.return %t, %e, %r : tensor<8x16xf16>, tensor<1024xf16>, tensor<1024xf16>
  }
}

// CHECK: builtin.module attributes {phaze.target = @acc, phaze.layer_energy = [#phaze.layer_energy<index = 0, fwd_j = 8.4224e-09, bwd_j = 6.73792e-08, opt_j = 0.0, selective_j = 0.0, full_j = 8.4224e-09, network_j = 0.0>, #phaze.layer_energy<index = 1, fwd_j = 0.0, bwd_j = 3.6864e-07, opt_j = 0.0, selective_j = 0.0, full_j = 0.0, network_j = 3.072e-07>]}
// CHECK: %a = phaze.matmul {{.*}}phaze.energy = #phaze.energy<compute_j = 1.024e-09, core_buffer_j = {{4.608[0-9]*}}e-10, global_buffer_j = {{5.376[0-9]*}}e-10, hbm_j = {{(6.4|6.39999*[0-9]*)}}e-09, network_j = 0.0>
// CHECK: %t = phaze.layout {{.*}}phaze.energy = #phaze.energy<compute_j = 0.0, core_buffer_j = 0.0, global_buffer_j = 0.0, hbm_j = 0.0, network_j = 0.0>
// CHECK: %e = phaze.elementwise {{.*}}phaze.energy = #phaze.energy<compute_j = 1.024e-09, core_buffer_j = {{6.144[0-9]*}}e-10, global_buffer_j = {{4.3008[0-9]*}}e-09, hbm_j = 6.144e-08, network_j = 0.0>
// CHECK: %r = phaze.collective {{.*}}phaze.energy = #phaze.energy<compute_j = 0.0, core_buffer_j = 0.0, global_buffer_j = 0.0, hbm_j = 6.144e-08, network_j = 3.072e-07>

// NOENERGY: phaze-estimate-energy: hardware 'toy' has no [energy] table (energy per MAC, per byte of each memory level, static power per mm^2); add one to price energy and power
// NOTILE: 'phaze.matmul' op requires 'phaze.tile'; run phaze-tile-pe-array first
// BADSEL: phaze-estimate-energy: selective=bogus: expected attention, op, layer:N or share:P
