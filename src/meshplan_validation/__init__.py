"""meshplan's validation layer: published, measured runs mapped to model / system / plan / stack and evaluated.

It imports the meshplan core and is never imported by it (tests/test_imports.py)."""
