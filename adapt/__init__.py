"""Runtime adaptation to a changing memory budget (RAP), an application built on the simulator.

The package sits above `sim` (it drives the engine through `sim.engine.simulate` and `sim.blocks`) and
below `real` (the real backend's studies write and read its GSI files); it never imports `real`,
`analysis` or the command line.

Modules (each owns one thing):
    importance   the GSI file format (schema_version 1: read, validate, write) and the block
                 importance vector a controller sees
    timelines    memory-availability timelines (step, sawtooth, bursts, files) as BudgetTimeline
    drop_quality perplexity of a dropped set: estimate from a GSI file, or a measured callable
    episode      replay a timeline + workload with a controller: footprint, violations, time, quality
    controllers  the Controller protocol (controllers/base.py) and one module per controller
    env, train   the Gymnasium environment and training of the learned controller

Block indices follow sim.blocks: block 2*l + k, k=0 "mha:l", k=1 "ffn:l". Sizes in bytes, times in
seconds of simulated time.
"""
