"""The discrete-event simulator (SimPy): engine, components, policies, runner, sweeps, and the CLI.

`sim` imports `devices` and `traces`; it never imports `real` or `analysis`, except `sim.cli`, the
only module that wires every package together (nothing imports the CLI).
"""
