"""How far a uKernel range tuning goes: the sizes the combination DP and the job both respect."""

MAX_S = 4096  # the largest dynamic-dimension value one tuning covers (dispatch tables extend beyond it)
MAX_UKERNELS = 8  # uKernels built per tuning (FTuner: a few suffice; each extra one costs a build)
MAX_CONV_M = 262_144  # a conv2d job's largest M = N·OH·OW: its dense table is tuned to MAX_S and extends, and the
# routes are timed at the support's own M; the bound keeps one call's im2col matrix (M × KH·KW·CI floats) in memory
