"""meshplan's research package: the learned residual predictor (learned.py, on the static op features of
features.py), the model zoo check-step and benchmarks/docs/measured.py run (zoo.py) and MLP-Mixer (mixer.py).

It ships beside meshplan (the same pyproject) and imports the core, which never imports it (tests/test_imports.py):
``meshplan check-step`` finds the zoo and ``--learned`` through the ``meshplan.research`` entry points
(meshplan.measure.plugins), and says how to install this package where it is missing."""
