"""Installs tests/faults/fault_injector.py in a Python process started with tests/faults on
PYTHONPATH and BABYGPT_FAULT_CONTROL set (the sweep and experiment scenarios of tests/test_faults.py);
does nothing otherwise."""

import os

if os.environ.get("BABYGPT_FAULT_CONTROL"):
    import fault_injector

    _injector = fault_injector.from_env()
    if _injector is not None:
        _injector.install()
