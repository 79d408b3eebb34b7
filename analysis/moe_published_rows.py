"""The published MoE-from-flash figures that analysis/moe_published.py recomputes, one row per figure.

A row names the figure, its source and conditions, the configuration the system ran (its own cache
size and policy), the device profile whose component numbers stand in for the machine, what the
publication leaves open and how the row fills it (`conditions`), and what the simulator lacks for
that system (`missing`). Rows are data: no tolerance or sign is chosen per row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PublishedRow:
    key: str
    system: str
    source: str
    model: str
    device: str
    metric: str                           # "tokens_per_s" | "hit_rate" (demand hits + prefetched hits)
    measured: tuple[float, float]         # (low, high): a single figure has low == high
    config: dict[str, Any]
    conditions: str                       # what the publication leaves open and how the row fills it
    missing: str = ""                     # what the simulator lacks for this system (empty: nothing known)
    top_k: int | None = None              # the system runs fewer experts than the model's router picks
    circular: str = ""                    # why, when component numbers share the figure's source
    cold_tokens: int = 0                  # > 0: the figure is per sequence of this many tokens, cache cold
    bound: str = "peak"                   # "peak" (tok/s), "belady" (demand cache), "belady+oracle-prefetch"
    open_top: bool = False                # the range's high end is open ("over 88%"), not an observed figure
    extra: dict[str, Any] = field(default_factory=dict)


MOE_LRC = ("Liang et al., 'Not All Models Suit Expert Offloading: On Local Routing Consistency of MoE Models' "
           "(arXiv 2505.16056), github.com/ljcleo/moe-lrc commit 61c86cf (MIT), src/54_chr_plot.ipynb cell 4 "
           "output: per-layer LRU cache hit rate with a cache of 2 x top-k experts per layer, each 512-token "
           "sample from a cold cache, mean over 2048 samples of each of 11 public corpora (RedPajama subsets, "
           "LMArena, OpenMath, OpenCode, OpenScience)")

ROWS: tuple[PublishedRow, ...] = (
    PublishedRow(
        "rapid-mlx-mixtral", "Rapid-MLX expert offloading",
        "github.com/raullenchai/Rapid-MLX pull request #1183 (2026-07-23): Mixtral 8x7B Q4, 26.3 GB, 32 GB Mac, "
        "per-expert format, 100% cached: 14.76 tok/s decode",
        "mixtral-8x7b", "apple-m4-32gb", "tokens_per_s", (14.76, 14.76),
        {"policy": "lru", "capacity": 8, "dtype": "int4"},
        "every expert cached, so a memory-bound decode; the PR names no chip: apple-m4-32gb (120 GB/s) assumed"),
    PublishedRow(
        "rapid-mlx-qwen36", "Rapid-MLX expert offloading",
        "github.com/raullenchai/Rapid-MLX pull request #1183: Qwen3.6-35B-A3B Q8, 37.7 GB, 32 GB Mac, stacked "
        "format, LRU cache of 4658 of 10240 experts (45%): 4.5-5.0 tok/s",
        "qwen3.6-35b-a3b", "apple-m4-32gb", "tokens_per_s", (4.5, 5.0),
        {"policy": "lru", "capacity": 4658, "scope": "global", "dtype": "int8"},
        "chip assumed (apple-m4-32gb); routing synthetic (no Qwen3.6 trace)",
        missing="MLX's per-layer mx.eval read-back is an estimate (0.2 ms, no published timing); reads of "
                "experts sliced out of stacked tensors; unified-memory contention between SSD DMA and the GPU"),
    PublishedRow(
        "mlx-moe-coder-next-208", "mlx-moe",
        "github.com/mu-hashmi/mlx-moe README: Qwen3-Coder-Next-4bit (46 GB) on a 32 GB Mac, capacity 208 experts "
        "per layer, 19.1 GB: 8-23 tok/s (misses fall back to cached experts; zero-eval dispatch)",
        "qwen3-coder-next", "apple-m4-32gb", "tokens_per_s", (8.0, 23.0),
        {"policy": "cache-aware", "params": {"max_swaps": 10, "protect_top": 0, "max_weight": 1.0},
         "capacity": 208, "dtype": "int4", "router_sync": False},
        "no reads during decode (misses rerouted to cached experts), so memory-bound; chip assumed",
        missing="MLX's gather_qmm over 512-expert stacks; Metal memory pressure above ~19 GB (the README's cliff)"),
    PublishedRow(
        "mlx-moe-coder-next-192", "mlx-moe",
        "github.com/mu-hashmi/mlx-moe README (earlier table): capacity 192 per layer, 17.7 GB: 6-13 tok/s",
        "qwen3-coder-next", "apple-m4-32gb", "tokens_per_s", (6.0, 13.0),
        {"policy": "cache-aware", "params": {"max_swaps": 10, "protect_top": 0, "max_weight": 1.0},
         "capacity": 192, "dtype": "int4", "router_sync": False},
        "as the 208 row; an earlier version of the engine",
        missing="as the 208 row; the earlier engine's dispatch (the README's table predates zero-eval dispatch)"),
    PublishedRow(
        "flash-moe-cuda-4090", "Flash-MoE CUDA (port of the Metal engine)",
        "Subbotin, 'Flash-MoE on NVIDIA' (github.com/danveloper/flash-moe paper/flash_moe_cuda.tex), Table "
        "'Performance across three NVIDIA GPUs': Qwen3.5-397B-A17B, K=4 + 1 shared, 4-bit (6.75 MB experts), "
        "RTX 4090, 2565 VRAM cache slots, frequency-weighted LRU: 5.35 tok/s average (5.86 peak)",
        "qwen3.5-397b-a17b", "rtx4090-nvme", "tokens_per_s", (5.35, 5.86),
        {"policy": "lfu", "capacity": 2565, "scope": "global", "dtype": "int4"},
        "routing synthetic: its locality, not the published 95% hit rate, decides the misses",
        missing="its GPU compute (0.54 ms per layer published against ~0.1 bandwidth-bound); the copy from the page "
                "cache into the pread buffer (~10 GB/s in the paper); the host page cache between VRAM and the SSD "
                "(the PCIe copy after each read, the second hop, is modelled: moe.host_copy_bytes_per_s)",
        top_k=4, circular="router read-back (0.04 ms per layer) taken from the same paper"),
    PublishedRow(
        "flash-moe-cuda-3060", "Flash-MoE CUDA (port of the Metal engine)",
        "same paper and table: RTX 3060 12 GB, 840 VRAM slots, 755 GB RAM, NVMe 9 GB/s: 2.92 tok/s average",
        "qwen3.5-397b-a17b", "rtx3060-nvme", "tokens_per_s", (2.92, 3.23),
        {"policy": "lfu", "capacity": 840, "scope": "global", "dtype": "int4"},
        "as the 4090 row; with 755 GB of RAM every expert sits in the host page cache, read over PCIe 3.0",
        missing="as the 4090 row (1.50 ms of GPU compute per layer published); the host page cache holds every "
                "expert here, so reads come over PCIe, not from the SSD",
        top_k=4, circular="router read-back and the 9 GB/s storage figure taken from the same paper"),
    PublishedRow(
        "specmd-olmoe-least-stale", "SpecMD (Least-Stale)",
        "Hoang et al., 'SpecMD: A Comprehensive Study On Speculative Expert Prefetching' (arXiv 2602.03921), "
        "abstract: over 88% hit rate on OLMoE with a cache of 5% of the model (0.6 GB of VRAM)",
        "olmoe-1b-7b", "rtx4090-nvme", "hit_rate", (0.88, 1.0),
        {"policy": "least-stale", "capacity": 51, "scope": "global", "dtype": "bf16", "prefetch": True},
        "5% of 1024 experts = 51 slots shared by all layers; SpecMD benchmarks caches under speculative "
        "prefetch, so the row runs the next-layer prefetch at the OLMoE family's default accuracy "
        "(devices/models/moe/prefetch/: the FATE fallback, 0.79) and counts prefetched experts as hits",
        missing="SpecMD's own predictor and its accuracy (not in the abstract); routing synthetic (no OLMoE trace)",
        bound="belady+oracle-prefetch", open_top=True),
    PublishedRow(
        "moe-lrc-olmoe-lru", "moe-lrc (LRU expert cache)", MOE_LRC + ": OLMoE-1B-7B-0125 0.572 (95% CI 0.570-0.574)",
        "olmoe-1b-7b", "rtx4090-nvme", "hit_rate", (0.570, 0.574),
        {"policy": "lru", "capacity": 16, "dtype": "bf16"},
        "16 = 2 x top-8 slots per layer; one synthetic 512-token sequence (seed 0) stands for the corpora",
        missing="routing synthetic at the synthesizer's default locality, not fitted to any OLMoE trace",
        cold_tokens=512, bound="belady"),
    PublishedRow(
        "moe-lrc-mixtral-lru", "moe-lrc (LRU expert cache)", MOE_LRC + ": Mixtral-8x7B-v0.1 0.547 (0.546-0.548)",
        "mixtral-8x7b", "rtx4090-nvme", "hit_rate", (0.546, 0.548),
        {"policy": "lru", "capacity": 4, "dtype": "bf16"},
        "4 = 2 x top-2 slots per layer; one synthetic 512-token sequence (seed 0)",
        missing="routing synthetic at the synthesizer's default locality, not fitted to any Mixtral trace",
        cold_tokens=512, bound="belady"),
    PublishedRow(
        "moe-lrc-qwen3-lru", "moe-lrc (LRU expert cache)", MOE_LRC + ": Qwen3-30B-A3B 0.611 (0.609-0.613)",
        "qwen3-30b-a3b", "rtx4090-nvme", "hit_rate", (0.609, 0.613),
        {"policy": "lru", "capacity": 16, "dtype": "bf16"},
        "16 = 2 x top-8 slots per layer; one synthetic 512-token sequence (seed 0)",
        missing="routing synthetic at the synthesizer's default locality, not fitted to any Qwen3 trace",
        cold_tokens=512, bound="belady"),
)
