"""Building kernels, below the platforms and the tuners that build (as MetaSchedule's `builder/`): the TVM target
and PassContext of a CUDA build (cuda), and the MetaSchedule builder every TVM platform hands its searches
(metaschedule). Nothing here knows a platform or a tuner."""
