"""Benchmarks that compare rlrun with other tools (optional `bench` extra; never imported by the product)."""
