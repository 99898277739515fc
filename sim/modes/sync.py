"""The weight sync of a split run (`rlsim.modes.split`): one collective of the trainer and every replica.

The trainer requests it; each replica is told at once (in replica order) and joins when its rule allows
(partial rollout: at the end of its current engine step; else once its in-flight responses have finished).
The sync starts when every replica has joined (an AllOf over one join event per replica) and publishes the
next policy version to all at its end (one `done` event the joined replicas wait on, resumed in join order).
"""
from __future__ import annotations

from typing import Callable

import simpy


class WeightSync:
    def __init__(self, env: simpy.Environment, replicas: int):
        self.env = env
        self.replicas = replicas
        self.version = 0                    # published policy version: syncs completed
        self.requested = False              # a sync is requested and not yet over
        self.listeners: list[Callable[[], None]] = []  # one per replica, replica order: told of each request
        self.joins: list[simpy.Event] = []  # (replicas,) this sync's join events
        self.done = env.event()             # triggered at the end of the sync in progress

    def request(self) -> simpy.Event:
        """(trainer) Ask every replica to join; the returned event fires once all have."""
        self.requested = True
        self.joins = [self.env.event() for _ in range(self.replicas)]
        for tell in self.listeners:
            tell()
        return self.env.all_of(self.joins)

    def join(self, r: int) -> simpy.Event:
        """(replica r) Join the requested sync; the returned event fires at its end."""
        self.joins[r].succeed()
        return self.done

    def publish(self) -> None:
        """(trainer, at the sync's end) The next policy version, for every replica at once."""
        self.version += 1
        self.requested = False
        ev, self.done = self.done, self.env.event()
        ev.succeed()
