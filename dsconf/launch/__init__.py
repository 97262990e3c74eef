"""Launching dsconf jobs as torch distributed jobs.

- ``dsconf.launch.core``: one job through torch elastic (``launch(task_fn, cfg)``); imports torch.
- ``dsconf.launch.entry``: ``@dsconf.main``, the ``@hydra.main`` whose task runs on every rank.
- ``dsconf.launch.sweep``: the jobs of a ``-m`` sweep, parallel packing, the summary.
- ``dsconf.launch.context``: what a running rank can ask (the job's DeepSpeed dict, its dir).

This package module imports nothing: ``import dsconf.launch.context`` stays cheap on every rank.
"""
