// phaze's errors are xDSL diagnostics: stock xdsl-opt (which finds phaze through the
// xdsl.universe entry point) checks them with --verify-diagnostics, and without it prints one
// line, no traceback (exit status 1). A pass that lacks what an earlier pass writes names the
// missing attribute and that pass.
// RUN: xdsl-opt %s -p phaze-place-devices --verify-diagnostics | filecheck %s
// RUN: not xdsl-opt %s -p phaze-place-devices 2>&1 | filecheck %s --check-prefix=ONELINE
// RUN: xdsl-opt %s -p phaze-schedule-ops --verify-diagnostics | filecheck %s --check-prefix=SCHED
// RUN: xdsl-opt %s -p phaze-estimate-latency --verify-diagnostics | filecheck %s --check-prefix=TILE
// RUN: phaze-opt %s -p phaze-place-devices --verify-diagnostics | filecheck %s

// CHECK: 'builtin.module' op requires 'phaze.layers'; run phaze-group-layers first
// ONELINE:      {{^}}error: 'builtin.module' op requires 'phaze.layers'; run phaze-group-layers first
// ONELINE-NOT:  {{.}}
// SCHED: 'phaze.matmul' op requires 'phaze.latency'; run phaze-estimate-latency first
// TILE: 'phaze.matmul' op requires 'phaze.tile'; run phaze-tile-pe-array first

builtin.module attributes {phaze.target = @acc} {
  phaze.accelerator @acc {name = "toy", clock_hz = 1.000000e+09 : f64, bytes_per_element = 2 : i64, tensor_cores = {count = 2 : i64, pe_x = 4 : i64, pe_y = 4 : i64, buffer_bytes = 256 : i64}, vector_cores = {count = 2 : i64, width = 4 : i64, buffer_bytes = 64 : i64}, global_buffer = {bytes = 4096 : i64, bandwidth_Bps = 6.400000e+10 : f64}, hbm = {bytes = 1073741824 : i64, bandwidth_Bps = 1.600000e+10 : f64}, network = [{name = "tray", group_size = 4 : i64, bandwidth_Bps = 1.000000e+09 : f64, latency_s = 1.000000e-06 : f64}]}
  func.func @train_step(%x: tensor<16x8xf16>, %w: tensor<8x8xf16>) -> tensor<16x8xf16> {
    %a = phaze.matmul %x, %w {phaze.phase = "fwd", phaze.module = "", phaze.layer = 0 : i64} : (tensor<16x8xf16>, tensor<8x8xf16>) -> tensor<16x8xf16>
    func.return %a : tensor<16x8xf16>
  }
}
