"""bench/run_speed.py --imported: each case is a published row's mode and split, spelled as `rlsim run` flags that
the command parses back into the same what-if."""
from __future__ import annotations

from dataclasses import replace

import typer

from bench.run_speed import IMPORTED, imported_whatifs, whatif_flags
from rlsim.cli import app
from rlsim.cli.options import parse_whatif
from rlsim.core.config import WhatIf


def test_imported_cases_are_splits_whose_flags_parse_back_to_their_what_ifs():
    run = typer.main.get_command(app).commands["run"]
    cases = imported_whatifs()
    assert len(cases) == len(IMPORTED)
    modes = set()
    for g, w in cases:
        assert w.gen_gpus and w.train_gpus, g.id
        ctx = run.make_context("run", ["--trace", "x.parquet", *whatif_flags(w)])
        assert WhatIf(**parse_whatif(dict(ctx.params), as_list=False)) == replace(w, updates=WhatIf().updates), g.id
        modes.add(w.mode)
    assert {"fully_async", "nemo_async"} <= modes
