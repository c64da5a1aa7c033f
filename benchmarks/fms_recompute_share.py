"""The share of blocks fms-fsdp's runs checkpointed, read off their published MFU and HFU.

    python benchmarks/fms_recompute_share.py

fms-fsdp's README names its runs' activation checkpointing only as "Selective AC" (its
``selective_checkpointing = P``: a share P of the blocks checkpointed whole, phazec's
``--selective-recompute share:P``), without P.  Its second table gives each run's MFU and HFU,
and the two differ only by what the step recomputes:

- MFU's FLOPs per token (the README: NanoGPT's and PaLM's method): ``6 N + 12 L h s`` (N the
  parameters, L layers, h the hidden size, s the sequence);
- HFU's (the README: PyTorch's FLOP counter, ``torch/utils/flop_counter.py``): every matmul of
  the step, ``6 N_mm`` for the linears (N_mm: the parameters of matmuls, the embedding and norms
  left out), SDPA's forward two batched matmuls (``4 s h`` a layer) and its backward five
  (``sdpa_backward_flop_count``: the scores recomputed, then four: ``10 s h``), plus the forward
  of every checkpointed block again: ``P L (2 N_mm,block + 4 s h)``.

So ``P = (HFU / MFU * MFU_flops - HFU_flops(P = 0)) / (L (2 N_mm,block + 4 s h))``.  The README's
figures have two decimals, so P is given with the range their rounding leaves.  The eager table
checks the method: its "Full AC" rows come out at P = 1 and its "Selective AC" 13B at 1/2 (the
share its rows are priced with).  ``data/published/multi_gpu_runs.csv`` prices the compiled rows
with the central P to two decimals.
"""

from __future__ import annotations

import csv
from pathlib import Path

from price_published import example_config  # this script's folder is first on sys.path

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "data" / "published" / "fms_fsdp_flops.csv"
#: The README's figures' last decimal: each is within half of it.
ROUNDING = 0.005


def flops_per_token(model: str) -> tuple[float, float, float]:
    """(MFU's FLOPs, HFU's FLOPs without recompute, HFU's FLOPs one share of the blocks
    recomputed adds), per token, of ``examples/<model>.py`` at its sequence length."""
    c = example_config(model)
    h, L, s, v = c.hidden_size, c.num_hidden_layers, c.max_position_embeddings, c.vocab_size
    kv = c.num_key_value_heads * (h // c.num_attention_heads)
    block_mm = 2 * h * h + 2 * h * kv + 3 * h * c.intermediate_size  # q, o; k, v; gate, up, down
    norms = (2 * L + 1) * h
    n = v * h * (1 if c.tie_word_embeddings else 2) + L * block_mm + norms
    n_mm = L * block_mm + v * h  # the head is a matmul, the embedding a lookup
    mfu = 6 * n + 12 * L * h * s
    hfu = 6 * n_mm + 14 * L * s * h
    recompute = L * (2 * block_mm + 4 * s * h)
    return mfu, hfu, recompute


def share(model: str, mfu: float, hfu: float) -> tuple[float, float, float]:
    """(P, its lowest, its highest) from the published MFU and HFU of a run of ``model``."""
    m, h0, r = flops_per_token(model)

    def p(ratio: float) -> float:
        return (ratio * m - h0) / r

    low = p((hfu - ROUNDING) / (mfu + ROUNDING))
    high = p((hfu + ROUNDING) / (mfu - ROUNDING))
    return p(hfu / mfu), low, high


def main() -> None:
    with TABLE.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    print(f"{'table':9s} {'model':11s} {'gpu':5s} {'MFU':>5s} {'HFU':>5s}  {'P':>5s}  range        the README's AC")
    for r in rows:
        p, low, high = share(r["model"], float(r["mfu"]), float(r["hfu"]))
        print(
            f"{r['table']:9s} {r['model']:11s} {r['gpu']:5s} {float(r['mfu']):5.2f} {float(r['hfu']):5.2f}  "
            f"{p:5.2f}  {low:5.2f}-{high:5.2f}  {r['activation_checkpointing']}"
        )


if __name__ == "__main__":
    main()
