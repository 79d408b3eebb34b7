"""The discrete-event simulator (SimPy): engine, components, policies, runner and sweeps.

`sim` imports only `devices`, `traces` and itself (tests/test_architecture.py checks it); the command
line that wires every package together is the top-level `flashsim` package.
"""
