// RUN: phaze-opt %s -p 'phaze-form-kernels{runtime=eager}' | filecheck %s --check-prefix=EAGER
// RUN: phaze-opt %s -p 'phaze-form-kernels{runtime=inductor}' | filecheck %s --check-prefix=EAGER
// RUN: phaze-opt %s -p 'phaze-form-kernels{runtime=megatron}' | filecheck %s --check-prefix=MEGATRON

// Two expert GEMMs as the importer expands aten._grouped_mm (rows of x [32, 16] spread over 4
// experts by a view that keeps the aten name), on a chip of compute capability 9.0 (Hopper):
// torch's one CUTLASS grouped kernel takes the bf16 one (launch 1); the fp32 one (transformers'
// experts under autocast) falls back to one GEMM per expert (launch 4).  A plain batched matmul
// is one kernel.  Megatron runs Transformer Engine's grouped GEMM: one kernel each.

builtin.module attributes {phaze.target = @acc} {
  phaze.accelerator @acc {name = "toy", clock_hz = 1.000000e+09 : f64, bytes_per_element = 2 : i64, tensor_cores = {count = 2 : i64, pe_x = 4 : i64, pe_y = 4 : i64, buffer_bytes = 256 : i64}, vector_cores = {count = 2 : i64, width = 4 : i64, buffer_bytes = 64 : i64}, global_buffer = {bytes = 4096 : i64, bandwidth_Bps = 6.400000e+10 : f64}, hbm = {bytes = 1073741824 : i64, bandwidth_Bps = 1.600000e+10 : f64}, calibration = {execution = "serial", compute_capability = 9.000000e+00 : f64}, network = [{name = "tray", group_size = 4 : i64, bandwidth_Bps = 1.000000e+09 : f64, latency_s = 1.000000e-06 : f64}]}
  func.func @train_step(%w: tensor<4x16x8xbf16> {phaze.param = "w"}, %x: tensor<32x16xbf16> {phaze.input = "x"}, %w32: tensor<4x16x8xf32> {phaze.param = "w32"}, %x32: tensor<32x16xf32> {phaze.input = "x32"}) -> (tensor<4x8x8xbf16>, tensor<4x8x8xf32>, tensor<4x8x8xf32>) {
    %xe = phaze.layout "view" %x aten "aten._grouped_mm.default" {phaze.module = "experts", phaze.phase = "fwd"} : (tensor<32x16xbf16>) -> tensor<4x8x16xbf16>
    %y = phaze.matmul %xe, %w {phaze.module = "experts", phaze.phase = "fwd"} : (tensor<4x8x16xbf16>, tensor<4x16x8xbf16>) -> tensor<4x8x8xbf16>
    %xe32 = phaze.layout "view" %x32 aten "aten._grouped_mm.default" {phaze.module = "experts", phaze.phase = "fwd"} : (tensor<32x16xf32>) -> tensor<4x8x16xf32>
    %y32 = phaze.matmul %xe32, %w32 {phaze.module = "experts", phaze.phase = "fwd"} : (tensor<4x8x16xf32>, tensor<4x16x8xf32>) -> tensor<4x8x8xf32>
    %xb = phaze.layout "view" %x32 aten "aten.view.default" {phaze.module = "bmm", phaze.phase = "fwd"} : (tensor<32x16xf32>) -> tensor<4x8x16xf32>
    %z = phaze.matmul %xb, %w32 {phaze.module = "bmm", phaze.phase = "fwd"} : (tensor<4x8x16xf32>, tensor<4x16x8xf32>) -> tensor<4x8x8xf32>
    func.return %y, %y32, %z : tensor<4x8x8xbf16>, tensor<4x8x8xf32>, tensor<4x8x8xf32>
  }
}

// EAGER:      %y = phaze.matmul %xe, %w {{.*}}phaze.kernel = #phaze.kernel<id = 1, launch = 1, onchip_read = 0, onchip_written = 0, causal = 0>
// EAGER:      %y32 = phaze.matmul %xe32, %w32 {{.*}}phaze.kernel = #phaze.kernel<id = 3, launch = 4, onchip_read = 0, onchip_written = 0, causal = 0>
// EAGER:      %z = phaze.matmul %xb, %w32 {{.*}}phaze.kernel = #phaze.kernel<id = 5, launch = 1, onchip_read = 0, onchip_written = 0, causal = 0>

// MEGATRON:   %y = phaze.matmul %xe, %w {{.*}}phaze.kernel = #phaze.kernel<id = 1, launch = 1,
// MEGATRON:   %y32 = phaze.matmul %xe32, %w32 {{.*}}phaze.kernel = #phaze.kernel<id = 3, launch = 1,
// MEGATRON:   %z = phaze.matmul %xb, %w32 {{.*}}phaze.kernel = #phaze.kernel<id = 5, launch = 1,
