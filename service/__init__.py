"""KernelFleet service: API, workers, store and the domain models they share."""

__version__ = "0.1.0"
