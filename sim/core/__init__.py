"""The simulator's core: the configs, the workload sampler, the engine at engine-step granularity and the synchronous
colocated loop.
"""
