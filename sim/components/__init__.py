"""Simulated hardware: flash (read service times, FIFO device), compute (phase costs, unified-memory
contention), memory (budget, fixed and KV bytes, timeline), and the decoder pipeline process."""
