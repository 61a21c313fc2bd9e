"""The Gemmini accelerator itself, below the platform that serves it and the BACO search that tunes it: its
design space and legality (space, legality), gemmini.h's own tiling (gemmini_h), the analytical cost, area and
SRAM models (model, area, sram), the network layers it runs (workloads) and the tools that measure it
(backends: ZigZag, SCALE-Sim, FireSim)."""
