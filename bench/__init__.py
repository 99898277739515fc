"""Benchmarks: speed, and rlrun against other tools (optional `bench` extra), here; the studies, real runs against
rlsim's predictions, in studies/. Run them from the repository root (`python -m bench.studies.batch_study`); the
product never imports them."""
