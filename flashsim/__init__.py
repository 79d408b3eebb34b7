"""The `flashsim` command line, the top layer (devices <- traces <- sim <- real <- analysis <- flashsim),
so nothing else imports it: `main` builds the parser and turns user errors into one line on stderr;
`commands/` holds one module per verb; `output` and `validation_output` print tables and JSON."""
