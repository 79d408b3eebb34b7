"""The real backend: real bytes from a real disk, a real neuron cache, real compute, driven by the
same policy objects as the simulator (units: bytes as int, seconds as float, rates in bytes/s and
FLOP/s).

Subpackages, by role:

* `weights`: the weight store on disk (FFN neuron bundles, 4 KiB aligned, resident tensors as
  safetensors, a checksummed manifest and its integrity record) and the conversion that writes it
  from a Hugging Face model, a GGUF file, or random weights of any ModelSpec's size.
* `io`: where a read is issued: direct-I/O (O_DIRECT) reads of sets of neurons into page-aligned
  buffers, coalesced, from a thread pool sized by the reads in flight.
* `runtime`: one token at a time: the executor (`backend`), the neuron cache, the compute device
  (CPU; CUDA / Jetson pinned buffers), model mode, shape mode, the mmap baseline, the predictors,
  and the records a run leaves behind.
* `bench`: the microbenchmarks behind `flashsim bench` (flash, compute, CUDA, request CPU cost,
  fio import, RAPL counters, host load).
* `validation`: where a profile is written and sim-vs-real is scored: `flashsim validate`,
  `flashsim calibrate`, profile writing and merging, drift checks.
* `studies`: measurements of a real model's behaviour that feed the simulator's inputs:
  quantization and selection quality, block importance (GSI) and pruning, the low-rank predictor's
  training and the persistence of its errors.

torch and transformers are imported lazily, inside functions: everything here imports without them.
"""
