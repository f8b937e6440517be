"""Generic training pieces: optimiser + schedule, device/AMP policy, checkpoints, metrics and curves."""
