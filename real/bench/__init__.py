"""The microbenchmarks behind `flashsim bench`: flash random reads against chunk size and reads in
flight (`bench_flash`, `bench_io`, `bench_reader`, `bench_request_cpu`, `bench_host_cpu`, `fio_import`),
dense and sparse compute on the CPU (`bench_compute`, `bench_dense_gemv`, `bench_sparse_ffn`) and a
CUDA GPU (`bench_cuda`), plus the host's load (`host_load`) and energy counters (`rapl`).
"""
