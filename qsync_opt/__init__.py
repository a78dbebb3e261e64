"""qsync-opt: mixed-precision plans for clusters of unlike accelerators."""

__version__ = "0.1.0"
