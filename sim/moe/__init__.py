"""Mixture-of-Experts runs: expert-cache policies (one module each, registered in sim/moe/base.py),
the residency walk over a routing trace (residency.py), speculative prefetch (prefetch.py), the
per-layer cost model with its analytic fast path (timing.py), the discrete-event engine (des.py),
and the run that ties them to a spec and a device (run.py)."""
