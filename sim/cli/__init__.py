"""The `flashsim` command line: one module per verb group, wired in `sim.cli.main`."""
