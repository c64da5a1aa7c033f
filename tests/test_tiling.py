"""Tiling of GEMMs onto the tensor cores: the model by hand, padding, the core split, the
vectorized form against the scalar one, and the ``phaze-tile-pe-array`` pass."""

from __future__ import annotations

import random

import numpy as np
import pytest
from xdsl.dialects.builtin import ModuleOp

from passes.algorithms.arch_space import paper_space
from passes.algorithms.tiling import Tiling, m_rows, tile_gemm, tile_gemm_scalar
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


def test_vectorized_equals_scalar_over_random_shapes_and_configs():
    rng = random.Random(1)
    configs = paper_space().configs
    sample = configs[np.random.default_rng(2).choice(len(configs), 300, replace=False)]
    for _ in range(40):
        b, m, n, k = rng.choice([1, 3, 32]), rng.randint(1, 9000), rng.randint(1, 5000), rng.randint(1, 5000)
        t = tile_gemm(b, m, n, k, sample["width"], sample["depth"], sample["num_tc"], sample["tc_buffer_bytes"])
        assert isinstance(t, Tiling) and t.cycles_split.shape == (300,)
        for j in range(0, 300, 7):
            c = sample[j]
            s = tile_gemm_scalar(
                b, m, n, k, int(c["width"]), int(c["depth"]), int(c["num_tc"]), int(c["tc_buffer_bytes"])
            )
            for f in (
                "m_block",
                "tiles_m",
                "tiles_n",
                "tiles_k",
                "tiles",
                "cores",
                "tile_cycles",
                "cycles_one",
                "cycles_split",
                "utilization",
            ):
                assert getattr(t, f)[j] == getattr(s, f), (f, b, m, n, k, c)


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
    assert t.cycles_split[1, 1] == tile_gemm_scalar(1, 4096, 4096, 4096, 128, 128, 8, 256 * 1024).cycles_split


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
