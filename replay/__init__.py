"""Trace format, validating reader, incremental writer, and models fitted to recorded runs.

Imports neither torch, vLLM nor SimPy: both the runner (writer) and the simulator (reader) use it.
"""
