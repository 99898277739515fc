"""The studies: real runs recorded on this machine and what rlsim predicted for them (batch size, lr or batch,
extrapolation, split fidelity). Run from the repository root: `python -m bench.studies.batch_study`. Their analysis
is `rlsim.replay.evaluation`; they call rlsim in process."""
