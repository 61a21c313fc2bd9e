"""Tuning algorithms, below the job kinds and above the platforms and the builder: `base` declares the one
interface every tuner implements (`Tuner.tune(task, sink) -> outcome`, each tuner's task, sink and outcome typed
beside it), `registry` names them all, and the tuners live beside: `sketch` (MetaSchedule), `ukernel` (dense over
a dynamic M on CPUs and CUDA, batch_matmul over tuples), `pipeline` (ALCOP's pipelined GEMMs), `gemmini` (BACO).
Nothing here knows Celery, HTTP or the store."""
