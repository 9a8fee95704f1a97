"""`cdc repair TABLE`: rebuild a table's damaged final (history, applied) from what staging and
the remembered deletes hold, then verify it with the check `cdc check` runs.

By concern: `diagnosis` (which of the table's Delta tables cannot be read, whether what final is
rebuilt from can be, and why a repair is refused; delta-rs and the logs, no Spark), `aside`
(what is set aside and the move itself: a rename, or on S3 a verified copy then the deletes) and
`rebuild` (overwrite-final over every staged change, then the check). The command's flow and its
lines are `cdc_tools/repair.py`'s.

Invariants: nothing is ever deleted (a damaged table is moved to a sibling folder named with a
UTC stamp); staging, tombstones and the ledger are only read; final is written only through
overwrite-final's own commits; success means the check passed on the rebuilt table.
"""
