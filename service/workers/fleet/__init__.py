"""Fleet-wide daily tuning: rank what the fleet spends time on, split a budget, submit ordinary jobs, report.

`ranking` and `scheduler` are pure (no store, no Celery); `daily` wires them to the store and the queue.
"""
