"""One module per verb (or verb group) of the `flashsim` command line, each with `register(sub)` that
adds its sub-parser and sets `func(args) -> int`; `real` and `adapt` wire their sub-commands from the
`real_*` and `adapt_*` modules. The verbs only parse options, call the library and print."""
