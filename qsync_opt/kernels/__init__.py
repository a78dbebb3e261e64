"""Quantized kernels: jinja2 templates rendered to C++ (CPU) and CUDA, built once and cached.

Layers, each its own module: spec (parameter sets, tiles.yaml) -> render (templates + headers to
source text) -> build (compilers) -> cache (keys, locks, markers) -> registry (the cached getters)
-> ops (the API the runtime calls, with a pure-torch reference path in reference.py; cuda_ops is
its CUDA half). dispatch decides which GEMM runs for each device and precision, and builds the
table the planner prices from. cuda_harness loads the CUDA kernels through ctypes for checks on a GPU.

Import `qsync_opt.kernels.ops` for the ops; importing this package builds nothing.
"""
