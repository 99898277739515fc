"""Execution modes of an RL step, in a registry (`registry.MODES`): the colocated loop (rlsim.core.pipeline) and split
devices with asynchronous rollout (the SimPy processes of this package).
"""
