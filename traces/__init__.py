"""Activation traces: the versioned on-disk format, capture from real models, synthetic traces,
statistics and the offline profiler. Imports `devices` only; torch is imported lazily by capture."""

from traces.format import SCHEMA_VERSION, Trace, TraceWriter, open_trace

__all__ = ["SCHEMA_VERSION", "Trace", "TraceWriter", "open_trace"]
