"""Loaded by every Python process with this folder on PYTHONPATH: a simulated GPU host if DSCONF_SIM_GPUS is set."""

import os

if os.environ.get("DSCONF_SIM_GPUS"):
    import fake_cuda

    fake_cuda.install_on_import()
