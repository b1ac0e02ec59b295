"""The launch: ``config`` (the one data model of the sglang server's flags and environment), ``flagtable``
(each flag's type, bounds and spelling per lane), ``lane_rules`` (a lane's sglang rules for SM120),
``checkpoints`` (a launch against its checkpoint), ``fp4_gemm``, and ``validator`` with its venv (the
lane's pinned parser)."""
