"""Fixtures shared by the simulator tests."""
import builtins

import pytest


@pytest.fixture
def without_ray(monkeypatch):
    """Make `import ray` fail, as on an install without the `ray` extra."""
    real = builtins.__import__

    def no_ray(name, *a, **k):
        if name == "ray" or name.startswith("ray."):
            raise ImportError("no ray")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_ray)
