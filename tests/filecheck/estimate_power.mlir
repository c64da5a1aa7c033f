// RUN: phaze-opt %s -p phaze-estimate-power | filecheck %s
// RUN: sed 's/static_w_per_mm2 = 5.000000e-01 : f64/&, power_limit_w = 1.500000e+00 : f64/' %s | phaze-opt -p phaze-estimate-power | filecheck %s --check-prefix=LIMIT
// RUN: sed 's/feasible = yes, binding = ""/feasible = no, binding = "memory: edited"/' %s | phaze-opt -p phaze-estimate-power | filecheck %s --check-prefix=NOFIT
// RUN: sed 's/, energy = {[^}]*}[^}]*}//' %s | not phaze-opt -p phaze-estimate-power 2>&1 | filecheck %s --check-prefix=NOENERGY
// RUN: sed 's/, area_mm2 = [^,]*//' %s | not phaze-opt -p phaze-estimate-power 2>&1 | filecheck %s --check-prefix=NOAREA
// RUN: sed 's/, phaze.layer_energy = \[[^]]*\]//' %s | not phaze-opt -p phaze-estimate-power 2>&1 | filecheck %s --check-prefix=NOENERGYREC

// The one-device plan of place_devices.mlir (two layers, 2 micro-batches of one sample, 12.2 ms a
// step) on the toy chip with an [energy] table, a 2 mm^2 die at 0.5 W/mm^2 of static power (1 W),
// and each layer's energy per micro-batch: forward 1 mJ, backward 2 mJ, the optimizer 0.1 mJ a
// step.  Hand-checked:
//
// CHECK  the device runs 2 * 2 * 3 mJ + 2 * 0.1 mJ = 12.2 mJ in 12.2 ms (1 W) and 1 W at rest:
//        2 W, a step of 12.2 + 12.2 = 24.4 mJ, 12.2 mJ a sample; no network (one device).
// LIMIT  the chip held to 1.5 W leaves 0.5 W for its ops: 12.2 mJ take at least 24.4 ms, the
//        step is stretched to it, 1.5 W, a step of 12.2 + 24.4 = 36.6 mJ, 18.3 mJ a sample; the
//        limit adds 12.2 ms (power_limit_s).  phaze.plan stays the placement's 12.2 ms (its one
//        writer is phaze-place-devices): the plan's time, plan_output.plan_record's, is
//        12.2 + 12.2 = 24.4 ms (2 / 24.4 ms = 81.97 samples/s).
// NOFIT  an infeasible plan gets no record.

builtin.module attributes {phaze.target = @acc, phaze.layer_memory = [#phaze.layer_memory<index = 0, param_bytes = 1000, grad_bytes = 1000, optimizer_bytes = 6000, saved_none_bytes = 4000, saved_selective_bytes = 2000, saved_full_bytes = 100, workspace_bytes = 500, recompute_workspace_bytes = 600, expert_param_bytes = 0, expert_optimizer_bytes = 0, fp8_weight_bytes = 0>, #phaze.layer_memory<index = 1, param_bytes = 1000, grad_bytes = 1000, optimizer_bytes = 6000, saved_none_bytes = 4000, saved_selective_bytes = 2000, saved_full_bytes = 100, workspace_bytes = 500, recompute_workspace_bytes = 600, expert_param_bytes = 0, expert_optimizer_bytes = 0, fp8_weight_bytes = 0>], phaze.plan = #phaze.plan<devices = 1, global_batch = 2, dp = 1, pp = 1, tp = 1, cp = 1, virtual_stages = 1, zero = 0, expert_parallel = 1, expert_tensor_parallel = 1, rank_order = "tp-dp-pp", pipeline_transfer = "whole", micro_batch_size = 1, num_micro_batches = 2, time_per_batch_s = 0.0122, throughput_samples_per_s = 163.93442622950818, max_memory_bytes = 24500, devices_used = 1, placement = "phaze", feasible = yes, binding = "">, phaze.stages = [#phaze.stage_info<index = 0, rank = 0, first_layer = 0, last_layer = 1, devices = 1, time_s = 0.006, compute_s = 0.006, recompute_s = 0.0, pp_comm_s = 0.0, zero_comm_s = 0.0, ep_comm_s = 0.0, memory_bytes = 24500, param_bytes = 2000, grad_bytes = 2000, optimizer_bytes = 12000, activation_bytes = 8000, workspace_bytes = 500, recompute = none, in_flight = 1, exposed_dp_s = 0.0, optimizer_s = 0.0002>], phaze.layer_energy = [#phaze.layer_energy<index = 0, fwd_j = 1.0e-03, bwd_j = 2.0e-03, opt_j = 1.0e-04, selective_j = 1.0e-04, full_j = 1.0e-03, network_j = 0.0>, #phaze.layer_energy<index = 1, fwd_j = 1.0e-03, bwd_j = 2.0e-03, opt_j = 1.0e-04, selective_j = 1.0e-04, full_j = 1.0e-03, network_j = 0.0>]} {
  phaze.accelerator @acc {name = "toy", clock_hz = 1.000000e+09 : f64, bytes_per_element = 2 : i64, area_mm2 = 2.000000e+00 : f64, tensor_cores = {count = 2 : i64, pe_x = 4 : i64, pe_y = 4 : i64, buffer_bytes = 256 : i64}, vector_cores = {count = 2 : i64, width = 4 : i64, buffer_bytes = 64 : i64}, global_buffer = {bytes = 4096 : i64, bandwidth_Bps = 6.400000e+10 : f64}, hbm = {bytes = 1073741824 : i64, bandwidth_Bps = 1.600000e+10 : f64}, energy = {mac_j = 1.000000e-12 : f64, vector_op_j = 1.000000e-12 : f64, sram_j_per_byte = {"64" = 1.000000e-13 : f64}, hbm_j_per_byte = 1.000000e-11 : f64, static_w_per_mm2 = 5.000000e-01 : f64}, network = [{name = "tray", group_size = 4 : i64, bandwidth_Bps = 1.000000e+09 : f64, latency_s = 1.000000e-06 : f64}, {name = "pod", group_size = 64 : i64, bandwidth_Bps = 5.000000e+08 : f64, latency_s = 2.000000e-06 : f64}]}
  func.func @train_step() {
    func.return
  }
}

// CHECK: phaze.power = #phaze.power<step_energy_j = 0.0244, chip_power_w = 2.0, mean_chip_power_w = 2.0, static_power_w = 1.0, network_energy_j = 0.0, energy_per_sample_j = 0.0122, power_limit_w = 0.0, clock_limited_share = 0.0, power_limit_s = 0.0>

// LIMIT: num_micro_batches = 2, time_per_batch_s = 0.0122, throughput_samples_per_s = {{163.934[0-9]*}},
// LIMIT: phaze.power = #phaze.power<step_energy_j = {{0.0366[0-9]*}}, chip_power_w = {{1.5[0-9]*}}, mean_chip_power_w = {{1.5[0-9]*}}, static_power_w = 1.0, network_energy_j = 0.0, energy_per_sample_j = {{0.0183[0-9]*}}, power_limit_w = 1.5, clock_limited_share = 1.0, power_limit_s = 0.0122>

// NOFIT: feasible = no
// NOFIT-NOT: phaze.power

// NOENERGY: phaze-estimate-power: hardware 'toy' has no [energy] table (energy per MAC, per byte of each memory level, static power per mm^2); add one to price energy and power
// NOAREA: phaze-estimate-power: hardware 'toy' has no area (give area_mm2) to price its static power
// NOENERGYREC: 'builtin.module' op requires 'phaze.layer_energy'; run phaze-estimate-energy first
