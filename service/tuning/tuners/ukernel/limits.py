"""How far a uKernel range tuning goes: the sizes the combination DP and the job both respect."""

MAX_S = 4096  # the largest dynamic-dimension value one tuning covers (dispatch tables extend beyond it)
MAX_UKERNELS = 8  # uKernels built per tuning (FTuner: a few suffice; each extra one costs a build)
