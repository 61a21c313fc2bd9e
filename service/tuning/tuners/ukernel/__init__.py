"""uKernel tuning for dynamic shapes (FTuner / DietCode style).

A few fixed-tile micro-kernels ("uKernels") are chosen from a hardware model without search
(`rules`), compiled once each as shape-generic TVM binaries over a symbolic M (`kernel`), and
assembled per shape: a shape S is covered by pieces, each run by one uKernel (`combine`). `cost`
holds the analytic rankers used to choose without measuring every shape.
"""
