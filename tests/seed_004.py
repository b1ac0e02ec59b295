"""Seed 004's launch (message 234 of the hand deployment), the profile inventory/proxmox encodes.

Word for word, except `--tp 8`, which sglang accepts only as an argparse abbreviation of --tp-size.
"""

SEED_004_FLAGS = """
--model lukealonso/GLM-5-NVFP4 --served-model-name glm-5 --reasoning-parser glm45
--tool-call-parser glm47 --trust-remote-code --tp-size 8 --mem-fraction-static 0.92
--max-running-requests 64 --kv-cache-dtype auto --quantization modelopt_fp4
--attention-backend flashinfer --fp8-gemm-backend cutlass --nsa-decode-backend trtllm
--nsa-prefill-backend trtllm --moe-runner-backend flashinfer_cutlass --disable-custom-all-reduce
--enable-flashinfer-allreduce-fusion --host 0.0.0.0 --port 8000
""".split()

SEED_004_ENV = {
    "NCCL_IB_DISABLE": "1",
    "NCCL_P2P_LEVEL": "PHB",
    "NCCL_ALLOC_P2P_NET_LL_BUFFERS": "1",
    "NCCL_MIN_NCHANNELS": "8",
    "OMP_NUM_THREADS": "8",
    "SAFETENSORS_FAST_GPU": "1",
    "CUDA_HOME": "/usr/local/cuda-12.8",
}

# Where inventory/proxmox deliberately differs from the seed (the reasons are in the profile): the
# weights are the hf_model role's pinned, verified local copy, Prometheus metrics are on (before
# --host, where the profile lists it), and two variables are added.
PROFILE_MODEL_DIR = "/var/lib/sglang/models/lukealonso--GLM-5-NVFP4/set-me-to-a-commit-sha"
PROFILE_ADDED_FLAG = "--enable-metrics"
PROFILE_ADDED_ENV = {"NCCL_P2P_DISABLE": "1", "HF_HUB_OFFLINE": "1"}


def profile_flags(model: str = PROFILE_MODEL_DIR) -> list[str]:
    """Seed 004's flags as the profile renders them: the same, with --model the local copy and
    --enable-metrics added."""
    flags = list(SEED_004_FLAGS)
    flags[flags.index("--model") + 1] = model
    flags.insert(flags.index("--host"), PROFILE_ADDED_FLAG)
    return flags
