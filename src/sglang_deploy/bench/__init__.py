"""The serving benchmark on the control node: ``runs`` (a sweep, its run directory, report and verdict
against a baseline), ``comparison`` (two runs side by side) and ``quality`` (a run's quality check).
``sglang_deploy_host.serving.bench_steps`` runs bench_serving's steps wherever the sweep runs."""
