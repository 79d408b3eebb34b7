"""The real backend: real bytes from a real disk, a real neuron cache, real compute.

Modules (units: bytes as int, seconds as float, rates in bytes/s and FLOP/s):

* `store` / `convert` / `store_writer`: the weight store on disk (FFN neuron bundles, 4 KiB aligned,
  resident tensors as safetensors, a checksummed manifest), written atomically from a Hugging Face
  model or, in shape mode, with random weights of any ModelSpec's size.
* `reader`: direct-I/O (O_DIRECT) reads of sets of neurons, coalesced, from a thread pool sized by
  the reads in flight; buffered fallback with page-cache eviction where O_DIRECT is unavailable.
* `cache`: per-layer preallocated neuron matrices (insert at the end, delete by moving the last
  rows into the holes) with a neuron -> slot index and an exact count of bytes moved.
* `mmap_baseline`: the OS demand-paging baseline, dense FFN over memory-mapped weights with the
  page cache held to a budget, measured.
* `bench_flash` / `bench_compute` / `fio_import` / `profile_writer`: microbenchmarks that write a
  DeviceProfile (the `devices/schema.py` schema) with provenance; `bench_reader` (the reader's own
  costs around its reads, the cache index work) times the real code on a small store for bench
  flash; `bench_io` (the bench file and its read
  primitives) and `bench_host_cpu` (how reads and compute slow each other) are bench flash's parts.
* `validate` (the grid of real runs and their replays), `validate_score` (the simulator's error
  against them, each real pass alone), `validate_keep` (a grid kept on disk, rescored) and
  `host_load` (the host's load around the runs): `flashsim validate`.
* `drift`: the host against its profile right now (validate's checks at its start, every few
  seconds between real runs, and at its end).
* `device`: the small, named device-specific part (CPU here; CUDA / Jetson pinned buffers).

torch and transformers are imported lazily, inside functions: everything here imports without them.
"""
