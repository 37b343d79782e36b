"""gpu-local: GPUs handed to local processes by CUDA_VISIBLE_DEVICES, each start in its own fence."""
