"""Tiling of GEMMs onto the tensor cores: the model by hand, padding, the core split, edge cases,
its bounds over a space, and the ``phaze-tile-pe-array`` pass."""

from __future__ import annotations

import numpy as np
import pytest
from xdsl.dialects.builtin import ModuleOp

from passes.algorithms.tiling import Tiling, m_rows, tile_gemm, tile_gemm_scalar
from phaze.search.arch_space import paper_space
from phaze_ir import dialect as ph
from phaze_ir.errors import PhazeError
from phaze_ir.hardware import load_hardware
from phaze_ir.hardware_ir import set_accelerator
from phaze_ir.ir import make_context, parse_module, print_module


def test_hand_checked_tiling():
    # 128 x 128 arrays, 256 KiB buffer: m_rows = 128 KiB / (4 B * 128) = 256.
    t = tile_gemm_scalar(1, 1000, 300, 200, 128, 128, 8, 256 * 1024)
    assert (t.m_block, t.tiles_m, t.tiles_n, t.tiles_k) == (250, 4, 3, 2)
    assert (t.tiles, t.cores) == (12, 8)
    assert t.tile_cycles == 2 * max(250, 128) + 128 + 128 - 1 == 755
    assert t.cycles_one == 12 * 755
    assert t.cycles_split == 2 * 755  # ceil(12 / 8) tiles on the busiest core
    assert t.utilization == (1000 * 300 * 200) / (1000 * 384 * 256)


def test_padding_utilization_on_a_non_multiple_dim():
    exact = tile_gemm_scalar(1, 4096, 128, 128, 128, 128, 1, 256 * 1024)
    padded = tile_gemm_scalar(1, 4096, 129, 128, 128, 128, 1, 256 * 1024)
    assert exact.utilization == 1.0
    assert padded.tiles_n == 2 and padded.utilization == 129 / 256
    k_padded = tile_gemm_scalar(1, 4096, 128, 130, 128, 128, 1, 256 * 1024)
    assert k_padded.tiles_k == 2 and k_padded.utilization == 130 / 256
    # Padding costs cycles: a second weight column is a second tile.
    assert padded.cycles_one == 2 * exact.cycles_one


def test_core_split_imbalance():
    # 9 tiles on 8 cores: one core runs two.
    t = tile_gemm_scalar(9, 256, 128, 128, 128, 128, 8, 256 * 1024)
    assert t.tiles == 9 and t.cores == 8
    assert t.cycles_split == 2 * t.tile_cycles and t.cycles_one == 9 * t.tile_cycles
    # Fewer tiles than cores: only that many are busy.
    t = tile_gemm_scalar(1, 100, 256, 64, 128, 128, 8, 256 * 1024)
    assert t.cores == 2 and t.cycles_split == t.tile_cycles


def test_default_buffer_streams_twice_the_depth():
    # The area model's 16 B per PE gives m_rows = 16*W*D/2 / (4*W) = 2*D: the next weight tile
    # (D cycles to load) always hides behind the current one's stream.
    for w in (2, 16, 128, 256):
        for d in (2, 32, 256):
            assert int(m_rows(16 * w * d, w)) == 2 * d


def test_large_gemm_fill_and_drain_amortized():
    t = tile_gemm_scalar(1, 8192, 8192, 8192, 128, 128, 8, 256 * 1024)
    ideal = 8192**3 / (8 * 128 * 128)
    assert 0.98 < ideal / t.cycles_split <= 1.0


def test_one_sized_gemm_on_one_pe():
    # Every count at its floor: one tile of one pass, the 1-cycle stream plus a 1-PE fill/drain.
    t = tile_gemm_scalar(1, 1, 1, 1, 1, 1, 1, 1)
    assert (t.m_block, t.tiles_m, t.tiles_n, t.tiles_k, t.tiles, t.cores) == (1, 1, 1, 1, 1, 1)
    assert (t.tile_cycles, t.cycles_one, t.cycles_split, t.utilization) == (2, 2, 2, 1.0)


def test_a_buffer_smaller_than_one_row_streams_one_row_per_tile():
    # 100 B: half is 50 B, under one 128-wide fp32 row (512 B); m_rows is floored at 1.
    assert int(m_rows(100, 128)) == 1
    t = tile_gemm_scalar(1, 5, 128, 128, 128, 128, 8, 100)
    assert (t.tiles_m, t.m_block, t.tiles) == (5, 1, 5)
    assert t.tile_cycles == 1 * max(1, 128) + 128 + 128 - 1  # the weight load (128) sets each pass


def test_m_blocks_are_equal_and_pad_less_than_one_row_per_block():
    # m_rows = 256: 257 rows make 2 blocks of 129 (1 padded row), not 256 + 1.
    t = tile_gemm_scalar(1, 257, 128, 128, 128, 128, 8, 256 * 1024)
    assert (t.tiles_m, t.m_block) == (2, 129)
    assert t.utilization == 257 / 258


def test_tiling_invariants_over_random_shapes_and_configs():
    """Over random GEMMs (1-sized, non-multiple and large dimensions) on a sample of the paper's
    space, every field of the vectorized tiling keeps the bounds of the module docstring."""
    rng = np.random.default_rng(1)
    configs = paper_space().configs
    c = configs[rng.choice(len(configs), 300, replace=False)]
    pe_x, pe_y, count, buf = (c[f].astype(np.int64) for f in ("width", "depth", "num_tc", "tc_buffer_bytes"))
    for b, m, n, k in [(1, 1, 1, 1), (3, 1, 4097, 1), (1, 50257, 1, 12288), (32, 8191, 129, 255)] + [
        tuple(int(v) for v in rng.integers(1, hi)) for hi in [(40, 9000, 5000, 5000)] * 30
    ]:
        t = tile_gemm(b, m, n, k, pe_x, pe_y, count, buf)
        assert isinstance(t, Tiling) and t.cycles_split.shape == (300,)
        rows = m_rows(buf, pe_x)
        assert (t.m_block <= np.maximum(rows, 1)).all() and (t.tiles_m == np.maximum(1, -(-m // rows))).all()
        assert (t.tiles_m * t.m_block >= m).all() and ((t.tiles_m - 1) * t.m_block < m).all()
        assert (t.tiles_m * t.m_block - m <= t.tiles_m - 1).all()  # equal blocks: under a row each
        assert (t.tiles_n * pe_x >= n).all() and ((t.tiles_n - 1) * pe_x < n).all()
        assert (t.tiles_k * pe_y >= k).all() and ((t.tiles_k - 1) * pe_y < k).all()
        assert (t.tiles == b * t.tiles_m * t.tiles_n).all() and (t.cores == np.minimum(count, t.tiles)).all()
        assert (t.tile_cycles == t.tiles_k * np.maximum(t.m_block, pe_y) + pe_y + pe_x - 1).all()
        assert (t.cycles_one == t.tiles * t.tile_cycles).all()
        assert (t.cycles_split == -(-t.tiles // count) * t.tile_cycles).all()
        assert ((t.utilization > 0) & (t.utilization <= 1)).all()


def test_the_scalar_tiling_is_one_row_of_the_vectorized_one_as_python_numbers():
    args = (2, 300, 200, 1000, 128, 128, 8, 256 * 1024)
    s, t = tile_gemm_scalar(*args), tile_gemm(*args)
    assert s.as_dict() == {"pe_x": 128, "pe_y": 128} | {f: getattr(t, f).item() for f in s.as_dict() if f[:3] != "pe_"}
    assert {type(v) for v in s.as_dict().values()} == {int, float} and type(s.utilization) is float
    assert s.tile_cycles == int(t.tile_cycles) and type(s.tile_cycles) is int


def test_a_gemm_past_int64_cycles_is_refused():
    with pytest.raises(OverflowError, match="more cycles than int64 holds"):
        tile_gemm_scalar(1000, 3 * 10**6, 3 * 10**6, 10**4, 1, 1, 1, 1)


def test_vectorized_broadcasts_ops_against_configs():
    m = np.array([[64], [4096]])
    t = tile_gemm(
        1,
        m,
        4096,
        4096,
        np.array([[4, 128]]),
        np.array([[256, 128]]),
        np.array([[64, 8]]),
        np.array([[16 * 4 * 256, 256 * 1024]]),
    )
    assert t.cycles_split.shape == (2, 2)
    # 4096 x 4096 x 4096 on 8 cores of 128 x 128, m_rows 256: 16 x 32 tiles of 32 passes
    assert t.cycles_split[1, 1] == (16 * 32 // 8) * (32 * 256 + 128 + 128 - 1)
    # 64 x 4096 x 4096 on 64 cores of 4 x 256, m_rows 512: 1 x 1024 tiles of 16 passes
    assert t.cycles_split[0, 0] == (1024 // 64) * (16 * 256 + 256 + 4 - 1)


# ---- the pass ---------------------------------------------------------------------------------

IR = """
builtin.module {
  func.func @f(%x: tensor<2x300x1000xf16>, %w: tensor<1000x200xf16>) -> tensor<2x300x200xf16> {
    %y = phaze.matmul %x, %w : (tensor<2x300x1000xf16>, tensor<1000x200xf16>) -> tensor<2x300x200xf16>
    func.return %y : tensor<2x300x200xf16>
  }
}
"""


def _run(module, spec):
    from xdsl.passes import PassPipeline

    from passes import ALL_PASSES

    PassPipeline.parse_spec(ALL_PASSES, spec).apply(make_context(), module)


def test_pass_writes_the_tiling_of_the_module_accelerator():
    module = parse_module(IR)
    acc = load_hardware("tpuv4")
    set_accelerator(module, acc)
    _run(module, "phaze-tile-pe-array")
    (mm,) = [o for o in module.walk() if isinstance(o, ph.MatmulOp)]
    tile = mm.attributes["phaze.tile"].as_dict()
    ref = tile_gemm_scalar(2, 300, 200, 1000, 128, 128, 8, 256 * 1024)
    assert tile == {f: getattr(ref, f) for f in tile}
    assert tile["pe_x"] == 128 and tile["tiles_n"] == 2 and tile["tiles_k"] == 8
    text = print_module(module)
    assert "#phaze.tile<pe_x = 128, pe_y = 128," in text
    assert print_module(parse_module(text)) == text  # round-trips


def test_pass_requires_an_accelerator():
    with pytest.raises(PhazeError, match="requires a 'phaze.accelerator' op for phaze-tile-pe-array"):
        _run(parse_module(IR), "phaze-tile-pe-array")
    with pytest.raises(PhazeError, match="requires a .phaze.accelerator. op for phaze-tile-pe-array"):
        _run(ModuleOp([]), "phaze-tile-pe-array")
