"""The sglang server on a host: its unit (``systemd``, ``unitcheck``) and launcher, what its flags say
(``unit_flags``: where it listens, its URL, secret flag names), the HTTP client (``endpoint``), the readiness and
correctness gates, the quality check (``quality``, its files in ``quality_reference``) and bench_serving's steps."""
