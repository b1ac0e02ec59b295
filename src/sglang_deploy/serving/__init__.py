"""One serving host: its sglang server resolved once (server), the preflight checks that stop the seeds' failures,
and the JIT caches on the kept disk."""
