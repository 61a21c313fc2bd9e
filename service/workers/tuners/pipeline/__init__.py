"""ALCOP-style multi-stage, multi-level pipelining of tiled GEMMs on NVIDIA GPUs.

`space` (the schedule space), `rules` (ALCOP's legality rules, checked before anything is built),
`model` (ALCOP's analytical latency model), `tuner` (model-guided tuning: analytical prior + XGBoost).
The TIR schedule that realises a configuration is `schedule`.
"""
