"""The names of a run's summary metrics, defined once: the simulator produces them (sim/results.py,
sim/energy.py) and every reader (analysis tables and figures, the command line's output, the real
backend's validation) imports them from here. Units are in the names (`_ms`, `_s`, `_bytes`,
`_bytes_per_s`); "per token" means per decode token. No imports: reading a name costs nothing.
"""

from __future__ import annotations

MS_PER_TOKEN = "ms_per_token"
TOKENS_PER_S = "tokens_per_s"
LATENCY_P50_MS = "latency_p50_ms"
LATENCY_P90_MS = "latency_p90_ms"
IO_MS_PER_TOKEN = "io_ms_per_token"
COMPUTE_MS_PER_TOKEN = "compute_ms_per_token"
STALL_MS_PER_TOKEN = "stall_ms_per_token"
MEMORY_MGMT_MS_PER_TOKEN = "memory_mgmt_ms_per_token"
FLASH_BYTES_PER_TOKEN = "flash_bytes_per_token"
FLASH_READS_PER_TOKEN = "flash_reads_per_token"
FLASH_THROUGHPUT_BYTES_PER_S = "flash_throughput_bytes_per_s"
DRAM_PEAK_BYTES = "dram_peak_bytes"
ACTIVATION_MASS_KEPT = "activation_mass_kept"
RECALL = "recall"
HIT_RATE = "hit_rate"
SUMMARY_KEYS = (
    MS_PER_TOKEN, TOKENS_PER_S, LATENCY_P50_MS, LATENCY_P90_MS, IO_MS_PER_TOKEN, COMPUTE_MS_PER_TOKEN,
    STALL_MS_PER_TOKEN, MEMORY_MGMT_MS_PER_TOKEN, FLASH_BYTES_PER_TOKEN, FLASH_READS_PER_TOKEN,
    FLASH_THROUGHPUT_BYTES_PER_S, DRAM_PEAK_BYTES, ACTIVATION_MASS_KEPT, RECALL, HIT_RATE,
)
# Energy per decode token (sim/energy.py): total joules, and millijoules by component in a mapping.
JOULES_PER_TOKEN = "joules_per_token"
ENERGY_MJ_PER_TOKEN = "energy_mj_per_token"
