"""Predict a training step, then run it (``meshplan check-step``): calibrate on this machine, trace the model, predict
its step op by op (predict.py), run and profile it for real (step.py, profile.py, replay.py), then compare them
(compare.py)."""
