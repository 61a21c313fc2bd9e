"""ALCOP-style multi-stage, multi-level pipelining of tiled GEMMs on NVIDIA GPUs.

`space` (the schedule space), `rules` (ALCOP's legality rules, on a declarative plan and on the scheduled
TIR, checked before anything is built), `model` (ALCOP's analytical latency model), `tuner` (model-guided
tuning: analytical prior + XGBoost), `schedule` (the pipelined tiled GEMM with a symbolic M) and
`lowering` (a configuration → the register-level pipeline, batch_matmul and conv2d on top of `schedule`,
build, and timing on a GPU).
"""
