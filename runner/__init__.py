"""Real RL runs: torch trains, vLLM generates, every event is recorded as an rlsim trace."""
