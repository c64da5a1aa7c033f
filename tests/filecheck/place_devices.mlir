// RUN: phaze-opt %s -p "phaze-place-devices{devices=1 global_batch=2}" | filecheck %s --check-prefix=ONE
// RUN: phaze-opt %s -p "phaze-place-devices{devices=2 global_batch=2}" | filecheck %s --check-prefix=DP
// RUN: phaze-opt %s -p 'phaze-place-devices{devices=2 global_batch=2 placement="expert:2,1,1"}' | filecheck %s --check-prefix=PP
// RUN: sed 's/bytes = 1073741824/bytes = 20000/' %s | phaze-opt -p "phaze-place-devices{devices=1 global_batch=2}" | filecheck %s --check-prefix=FULL
// RUN: sed 's/bytes = 1073741824/bytes = 20000/' %s | phaze-opt -p "phaze-place-devices{devices=1 global_batch=2 recompute=none}" | filecheck %s --check-prefix=NOFIT
// RUN: not phaze-opt %s -p 'phaze-place-devices{devices=2 global_batch=2 placement="expert:2,x"}' 2>&1 | filecheck %s --check-prefix=BADPLACE
// RUN: not phaze-opt %s -p 'phaze-place-devices{devices=2 global_batch=2 placement="expert:2,2,1"}' 2>&1 | filecheck %s --check-prefix=TOOMANY
// RUN: sed 's/, phaze.layer_memory = \[[^]]*\]//' %s | not phaze-opt -p "phaze-place-devices{devices=2 global_batch=2}" 2>&1 | filecheck %s --check-prefix=NOMEM

// Two equal block layers on the toy chip of tile_pe_array.mlir (1 GiB of HBM; the tray: 1 GB/s,
// 1 us), each (per micro-batch of 1 sample): forward 1 ms, backward 2 ms, the optimizer 0.1 ms a
// step; 1000 B of weights, 1000 B of gradients, 6000 B of optimizer state, 500 B of workspace
// (600 B while recomputing); stashed activations 4000 B (none), 2000 B (selective, 0.1 ms to
// recompute) or 100 B (full, 1 ms); 100 B cross a stage boundary each way.  The step function's
// two views stand for the layers' ops (they get phaze.stage).  Global batch 2, hand-checked:
//
// ONE  1 device: 2 micro-batches of 2 * 3 ms, the optimizer 2 * 0.1 ms: 12.2 ms.  Memory
//      2000 + 2000 + 12000 + 2 * 4000 (one micro-batch in flight) + 500 = 24500 B.
// DP   2 devices: DP 2 beats PP 2 (below): one micro-batch each, 6 ms, then the gradients'
//      ring all-reduce on the tray, in fp32 (twice the f16 gradients' 2000 B): 2 * 1/2 * 4000 /
//      1e9 + 2 * 1e-6 = 6 us exposed, then the optimizer: 6.206 ms.
// PP   expert:2,1,1 (pipeline of 2, one layer a stage): 1F1B over (m + p - 1) = 3 slots of
//      3 ms + the 100 B sent each way (2 * (1e-6 + 100 / 1e9) = 2.2 us), then 0.1 ms of
//      optimizer: 9.1066 ms.  Stage 0 holds 2 micro-batches in flight (8000 B), stage 1 one.
// FULL with 20000 B of HBM no stage fits without recompute (24500 B) nor selective (2000 + 2000 +
//      12000 + 2 * 2000 + 600 = 20600 B); full recompute fits in 16800 B and adds the forward
//      again, 2 ms a micro-batch: 2 * 8 + 0.2 = 16.2 ms.
// NOFIT the same chip with recompute=none: written, infeasible, with the binding constraint.

builtin.module attributes {phaze.target = @acc, phaze.layers = [#phaze.layer_info<index = 0, kind = block, module = "h.0", same_as = 0, param_bytes = 1000, saved_bytes = 0, boundary_bytes = 100, grad_boundary_bytes = 100, fwd_flops = 1, bwd_flops = 2, opt_flops = 0, num_ops = 1, experts = 0, dispatch_bytes = 0>, #phaze.layer_info<index = 1, kind = block, module = "h.1", same_as = 0, param_bytes = 1000, saved_bytes = 0, boundary_bytes = 100, grad_boundary_bytes = 100, fwd_flops = 1, bwd_flops = 2, opt_flops = 0, num_ops = 1, experts = 0, dispatch_bytes = 0>], phaze.layer_schedule = [#phaze.layer_schedule<index = 0, fwd_s = 1.0e-03, bwd_s = 2.0e-03, opt_s = 1.0e-04, cast_s = 0.0, tp_comm_s = 0.0, status = optimal, gap = 0.0>, #phaze.layer_schedule<index = 1, fwd_s = 1.0e-03, bwd_s = 2.0e-03, opt_s = 1.0e-04, cast_s = 0.0, tp_comm_s = 0.0, status = optimal, gap = 0.0>], phaze.layer_recompute = [#phaze.layer_recompute<index = 0, none_bytes = 4000, selective_bytes = 2000, full_bytes = 100, selective_s = 1.0e-04, full_s = 1.0e-03>, #phaze.layer_recompute<index = 1, none_bytes = 4000, selective_bytes = 2000, full_bytes = 100, selective_s = 1.0e-04, full_s = 1.0e-03>], phaze.layer_memory = [#phaze.layer_memory<index = 0, param_bytes = 1000, grad_bytes = 1000, optimizer_bytes = 6000, saved_none_bytes = 4000, saved_selective_bytes = 2000, saved_full_bytes = 100, workspace_bytes = 500, recompute_workspace_bytes = 600, expert_param_bytes = 0, expert_optimizer_bytes = 0, fp8_weight_bytes = 0>, #phaze.layer_memory<index = 1, param_bytes = 1000, grad_bytes = 1000, optimizer_bytes = 6000, saved_none_bytes = 4000, saved_selective_bytes = 2000, saved_full_bytes = 100, workspace_bytes = 500, recompute_workspace_bytes = 600, expert_param_bytes = 0, expert_optimizer_bytes = 0, fp8_weight_bytes = 0>]} {
  phaze.accelerator @acc {name = "toy", clock_hz = 1.000000e+09 : f64, bytes_per_element = 2 : i64, tensor_cores = {count = 2 : i64, pe_x = 4 : i64, pe_y = 4 : i64, buffer_bytes = 256 : i64}, vector_cores = {count = 2 : i64, width = 4 : i64, buffer_bytes = 64 : i64}, global_buffer = {bytes = 4096 : i64, bandwidth_Bps = 6.400000e+10 : f64}, hbm = {bytes = 1073741824 : i64, bandwidth_Bps = 1.600000e+10 : f64}, network = [{name = "tray", group_size = 4 : i64, bandwidth_Bps = 1.000000e+09 : f64, latency_s = 1.000000e-06 : f64}, {name = "pod", group_size = 64 : i64, bandwidth_Bps = 5.000000e+08 : f64, latency_s = 2.000000e-06 : f64}]}
  func.func @train_step(%x: tensor<8x8xf16>) -> tensor<8x8xf16> {
    %a = phaze.layout "view" %x aten "aten.view.default" {phaze.phase = "fwd", phaze.layer = 0 : i64} : (tensor<8x8xf16>) -> tensor<8x8xf16>
    %b = phaze.layout "view" %a aten "aten.view.default" {phaze.phase = "fwd", phaze.layer = 1 : i64} : (tensor<8x8xf16>) -> tensor<8x8xf16>
    func.return %b : tensor<8x8xf16>
  }
}

// ONE: phaze.plan = #phaze.plan<devices = 1, global_batch = 2, dp = 1, pp = 1, tp = 1, cp = 1, virtual_stages = 1, zero = 0, expert_parallel = 1, expert_tensor_parallel = 1, rank_order = "tp-dp-pp", pipeline_transfer = "whole", micro_batch_size = 1, num_micro_batches = 2, time_per_batch_s = 0.0122, throughput_samples_per_s = {{163.934[0-9]*}}, max_memory_bytes = 24500, devices_used = 1, placement = "phaze", feasible = yes, binding = "">
// ONE-SAME: phaze.stages = [#phaze.stage_info<index = 0, rank = 0, first_layer = 0, last_layer = 1, devices = 1, time_s = 0.006, compute_s = 0.006, recompute_s = 0.0, pp_comm_s = 0.0, zero_comm_s = 0.0, ep_comm_s = 0.0, memory_bytes = 24500, param_bytes = 2000, grad_bytes = 2000, optimizer_bytes = 12000, activation_bytes = 8000, workspace_bytes = 500, recompute = none, in_flight = 1, exposed_dp_s = 0.0, optimizer_s = 0.0002>]
// ONE: %a = {{.*}}phaze.stage = 0 : i64
// ONE: %b = {{.*}}phaze.stage = 0 : i64

// DP: phaze.plan = #phaze.plan<devices = 2, global_batch = 2, dp = 2, pp = 1, tp = 1, {{.*}}, num_micro_batches = 1, time_per_batch_s = 0.006206, {{.*}}, devices_used = 2, placement = "phaze", feasible = yes, binding = "">
// DP-SAME: phaze.stages = [#phaze.stage_info<index = 0, {{.*}}, time_s = 0.006, {{.*}}, exposed_dp_s = 6.0e-06, optimizer_s = 0.0002>]

// PP: phaze.plan = #phaze.plan<devices = 2, global_batch = 2, dp = 1, pp = 2, tp = 1, {{.*}}, num_micro_batches = 2, time_per_batch_s = 0.0091066, {{.*}}, max_memory_bytes = 16500, devices_used = 2, placement = "expert:2,1,1", feasible = yes, binding = "">
// PP-SAME: phaze.stages = [#phaze.stage_info<index = 0, rank = 0, first_layer = 0, last_layer = 0, devices = 1, time_s = 0.0030022, compute_s = 0.003, recompute_s = 0.0, pp_comm_s = 2.2e-06, {{.*}}, activation_bytes = 8000, {{.*}}, in_flight = 2, {{.*}}>, #phaze.stage_info<index = 1, rank = 1, first_layer = 1, last_layer = 1, {{.*}}, activation_bytes = 4000, {{.*}}, in_flight = 1, {{.*}}>]
// PP: %a = {{.*}}phaze.stage = 0 : i64
// PP: %b = {{.*}}phaze.stage = 1 : i64

// FULL: phaze.plan = #phaze.plan<devices = 1, {{.*}}, time_per_batch_s = 0.0162, {{.*}}, max_memory_bytes = 16800, {{.*}}, feasible = yes, binding = "">
// FULL-SAME: #phaze.stage_info<index = 0, {{.*}}, time_s = 0.008, compute_s = 0.006, recompute_s = 0.002, {{.*}}, memory_bytes = 16800, {{.*}}, activation_bytes = 200, workspace_bytes = 600, recompute = full, in_flight = 1,

// NOFIT: phaze.plan = #phaze.plan<devices = 1, global_batch = 2, dp = 0, pp = 0, {{.*}}, placement = "phaze", feasible = no, binding = "memory: no placement fits: the least memory any option needs is 23.9 KiB (24500 bytes) per device on its largest stage (DP 1, PP 1, TP 1, recompute none, ZeRO 0, 1F1B), but HBM is 19.5 KiB (20000 bytes)">
// NOFIT-SAME: phaze.stages = []
// NOFIT-NOT: phaze.stage =

// BADPLACE: phaze-place-devices: placement 'expert:2,x': expected 'phaze', 'expert' or 'expert:PP,DP,TP'
// TOOMANY: error: placement expert:2,2,1 needs 4 devices (PP 2 x DP 2 x TP 1) but the cluster has 2
// TOOMANY-NOT: contradicts
// NOMEM: 'builtin.module' op requires 'phaze.layer_memory'; run phaze-insert-recompute first
