"""The model's files on a host: safetensors headers, the checkpoint's inspection, the weights' copy and check."""
