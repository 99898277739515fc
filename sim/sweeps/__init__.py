"""Grids of what-ifs: evaluated in process, on a local pool or on Ray, ranked; measured ranks; the plan."""
