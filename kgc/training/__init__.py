"""What both tasks share: the training loop (loop.py) and its session (session.py), run directories (run.py),
builders (setup.py), and the optimiser, schedule, device/AMP policy, checkpoints, metrics log and curves
(common.py)."""
