"""What-ifs: fit a trace once (`predict.prepare`), evaluate candidates against the reference on the same hardware, the
Outcome, replay fidelity, memory per device.
"""
