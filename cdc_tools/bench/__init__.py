"""The benchmarks behind docs/performance.md: `cdc bench`, `cdc bench-cycle` and their parts.

Each writes its figures as JSON under `benchmarks/results/` (indexed by `results_index`); none
runs in production, and the production CLI imports them only when a bench command runs.
"""
