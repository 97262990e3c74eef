"""``hydra/sweeper=dsconf_tune``: the fastest configuration that fits, measured on the user's own model.

``python train.py -m hydra/sweeper=dsconf_tune`` searches ZeRO stage x offload x micro batch per GPU (and the user's
own dimensions) with the global batch fixed, each trial a real distributed job through the app's own launcher:

- ``settings``: ``hydra.sweeper.*``, typed and checked;
- ``space``: the candidates and each one's overrides;
- ``prior``: the memory each candidate should need (DeepSpeed's estimators and a measured probe);
- ``trial``: one candidate's job, and what its ranks measured (``dsconf.launch.trial_meter`` runs in the ranks);
- ``study``: the search in Optuna's storage (resumable), failures, the winner;
- ``results``: ``trials.json``, ``summary.md``, ``best.yaml``; ``report``: ``report.html``.

The Hydra plugin (``hydra_plugins/dsconf_tune``) is a thin shell over ``study.Tuner``.
"""
