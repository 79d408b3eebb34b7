"""Where a profile is written and sim-vs-real is scored: `validate` (a grid of real runs replayed in
the simulator, and its report; the grid in `validate_grid`, running it in `validate_runs`, its figure
in `validate_plot`), `validate_score` (the error against each real pass and the repeat floor),
`validate_keep` (a kept grid, rescored), `calibration` (bench then validate into a profile),
`profile_writer` / `profile_merge` (measured profiles, atomic and merged) and `drift` (the host
against its profile right now).
"""
