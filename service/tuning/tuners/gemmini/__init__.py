"""Gemmini HW/SW co-tuning (BACO): design space, analytical model, importance estimation, co-exploration
and measurement backends (ZigZag, SCALE-Sim, FireSim). Free of Celery/HTTP."""
