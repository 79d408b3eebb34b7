"""Running a model one token at a time on real storage and compute: `backend` (the executor: the
simulator's PolicyStack decides, real reads and compute follow), `cache` (per-layer neuron matrices),
`device` (CPU or CUDA and pinned host buffers), `model_mode` (a real llama-family model),
`shape_mode` (any ModelSpec with random weights), `mmap_baseline` (OS demand paging, measured),
`predictors` (what each token computes in model mode) and `records` (what a run leaves behind).
"""
