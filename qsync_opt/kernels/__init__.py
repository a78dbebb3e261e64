"""qsync-opt."""
