// RUN: phaze-opt %s -p phaze-tile-pe-array | filecheck %s
// RUN: phaze-opt %s -p phaze-tile-pe-array,phaze-tile-pe-array | filecheck %s

// A toy chip: 2 tensor cores of 4 x 4 PEs with a 256 B per-core buffer, so a tile streams at
// most m_rows = (256 / 2) / (4 B * pe_x) = 8 rows of the left operand (weight-stationary: K on
// the depth pe_y, N on the width pe_x, M streamed).  tile_cycles = tiles_k * max(m_block, pe_y)
// + pe_y + pe_x - 1; cycles_one = tiles * tile_cycles; cycles_split = ceil(tiles / 2) * tile_cycles.
// Running the pass twice gives the same result.

builtin.module attributes {phaze.target = @acc} {
  phaze.accelerator @acc {name = "toy", clock_hz = 1.000000e+09 : f64, bytes_per_element = 2 : i64, tensor_cores = {count = 2 : i64, pe_x = 4 : i64, pe_y = 4 : i64, buffer_bytes = 256 : i64}, vector_cores = {count = 2 : i64, width = 4 : i64, buffer_bytes = 64 : i64}, global_buffer = {bytes = 4096 : i64, bandwidth_Bps = 6.400000e+10 : f64}, hbm = {bytes = 1073741824 : i64, bandwidth_Bps = 1.600000e+10 : f64}, network = [{name = "tray", group_size = 4 : i64, bandwidth_Bps = 1.000000e+09 : f64, latency_s = 1.000000e-06 : f64}, {name = "pod", group_size = 64 : i64, bandwidth_Bps = 5.000000e+08 : f64, latency_s = 2.000000e-06 : f64}]}
  func.func @train_step(%x: tensor<16x8xf16>, %w: tensor<8x8xf16>, %p: tensor<6x5xf16>, %q: tensor<5x6xf16>, %s: tensor<3x4x4xf16>, %t: tensor<3x4x4xf16>) -> (tensor<16x8xf16>, tensor<6x6xf16>, tensor<3x4x4xf16>) {
    // M = 16 in 2 blocks of 8, N = 8 and K = 8 in 2 weight tiles each: 4 tiles of 2*8 + 7 = 23 cycles.
    %a = phaze.matmul %x, %w : (tensor<16x8xf16>, tensor<8x8xf16>) -> tensor<16x8xf16>
    // N = 6 and K = 5 pad to 8: utilization 6*6*5 / (6*8*8) = 0.46875; tiles of 2*6 + 7 = 19 cycles.
    %b = phaze.matmul %p, %q : (tensor<6x5xf16>, tensor<5x6xf16>) -> tensor<6x6xf16>
    // Batch 3: 3 tiles of max(4, 4) + 7 = 11 cycles on 2 cores: the slower core runs 2 of them.
    %c = phaze.matmul %s, %t : (tensor<3x4x4xf16>, tensor<3x4x4xf16>) -> tensor<3x4x4xf16>
    %d = phaze.elementwise "add" %c, %c aten "aten.add.Tensor" : (tensor<3x4x4xf16>, tensor<3x4x4xf16>) -> tensor<3x4x4xf16>
    func.return %a, %b, %d : tensor<16x8xf16>, tensor<6x6xf16>, tensor<3x4x4xf16>
  }
}

// CHECK: %a = phaze.matmul %x, %w {phaze.tile = #phaze.tile<pe_x = 4, pe_y = 4, m_block = 8, tiles_m = 2, tiles_n = 2, tiles_k = 2, tiles = 4, cores = 2, utilization = 1.0, cycles_one = 92, cycles_split = 46>}
// CHECK: %b = phaze.matmul %p, %q {phaze.tile = #phaze.tile<pe_x = 4, pe_y = 4, m_block = 6, tiles_m = 1, tiles_n = 2, tiles_k = 2, tiles = 2, cores = 2, utilization = 0.46875, cycles_one = 38, cycles_split = 19>}
// CHECK: %c = phaze.matmul %s, %t {phaze.tile = #phaze.tile<pe_x = 4, pe_y = 4, m_block = 4, tiles_m = 1, tiles_n = 1, tiles_k = 1, tiles = 3, cores = 2, utilization = 1.0, cycles_one = 33, cycles_split = 22>}
// CHECK-NOT: phaze.tile
// CHECK: func.return
