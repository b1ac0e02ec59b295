#!/usr/bin/env python3
"""Build the flashinfer JIT modules sglang's flashinfer MLA backend needs for GLM-5's MLA shapes, ahead of
the server that needs them (glm5-arch.sh starts it in the background during an earlier call's starts).

    FLASHINFER_WORKSPACE_BASE=DIR python3 flashinfer_prebuild.py --log FILE

On SM90 sglang 0.5.17's FlashInferMLAAttnBackend makes BatchMLAPagedAttentionWrapper(backend="auto") for
decode, target-verify and paged prefill (flashinfer picks fa3 on SM90a: one module for q/kv/o bf16,
int32 indices, ckv 512, kpe 64: the fp8 pool is converted to bf16 before the kernel) and
BatchPrefillWithRaggedKVCacheWrapper(backend="auto") for prefill without a prefix (fa3 for qk 256 = 192
nope + 64 rope, vo 256, causal, no sliding window or soft cap). The same JitSpec as the server's, in the
same workspace, so the server finds them built (flashinfer locks each module while it builds it).
Each build's seconds go to --log (JSON lines), which the run keeps as the cold-JIT figure.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from flashinfer.jit import attention
from flashinfer.utils import determine_attention_backend, determine_mla_backend

MLA = {"head_dim_ckv": 512, "head_dim_kpe": 64}
PREFILL = {"head_dim_qk": 192 + 64, "head_dim_vo": 256}


def specs(device: torch.device) -> list:
    bf16, i32 = torch.bfloat16, torch.int32
    mla_backend = determine_mla_backend(device)
    prefill_backend = determine_attention_backend(
        device, 0, False, False, bf16, bf16, head_dim_qk=PREFILL["head_dim_qk"], head_dim_vo=PREFILL["head_dim_vo"]
    )
    return [
        attention.gen_batch_mla_module(mla_backend, bf16, bf16, bf16, i32, MLA["head_dim_ckv"], MLA["head_dim_kpe"], False),
        attention.gen_batch_prefill_module(
            prefill_backend, bf16, bf16, bf16, i32, PREFILL["head_dim_qk"], PREFILL["head_dim_vo"], 0, False, False, False
        ),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", required=True)
    args = parser.parse_args()
    rc = 0
    with open(args.log, "a", encoding="utf-8") as log:
        for spec in specs(torch.device("cuda")):
            started = time.time()
            status = "already built" if spec.is_compiled else "built"
            try:
                spec.build(verbose=False)
            except Exception as err:  # noqa: BLE001 -- recorded; the server then builds it itself
                status, rc = f"failed: {type(err).__name__}: {str(err)[-500:]}", 1
            log.write(json.dumps({"module": spec.name, "status": status, "seconds": round(time.time() - started, 1)}) + "\n")
            log.flush()
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
