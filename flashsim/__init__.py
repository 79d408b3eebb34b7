"""The `flashsim` command line: one module per verb group, wired in `flashsim.main`; the top layer
(devices <- traces <- sim <- real <- analysis <- flashsim), so nothing else imports it."""
