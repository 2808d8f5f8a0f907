"""Test support: committed real fixtures and ExecuTorch-side reference tools (see fixtures.py,
et_reference.py, et_runtime.py)."""
