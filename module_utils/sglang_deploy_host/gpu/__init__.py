"""The GPUs of a host: their facts and idle check, kernels' fatbin archs, the driver's state, PCI devices, NCCL."""
