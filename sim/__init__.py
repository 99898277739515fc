"""SimPy what-if model of the RL loop, what-if extrapolation, sweeps, ranking, charts and reports."""
