"""Running a model one token at a time on real storage and compute: `backend` (the executor: the
simulator's PolicyStack decides, real reads and compute follow), `executor_plan` (the plans and
cache sizes made before the first token), `sparse_ffn` (the FFN on the computed rows, CPU or CUDA),
`cache_matrices` (per-layer neuron matrices), `device` (CPU or CUDA and pinned host buffers),
`model_mode` (a real llama-family model), `shape_mode` (any ModelSpec with random weights),
`mmap_baseline` (OS demand paging, measured), `predictors` (what each token computes in model mode)
and `run_outputs` (what a run leaves behind).
"""
