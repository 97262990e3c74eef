"""Hydra sweeper plugin: ``hydra/sweeper=dsconf_tune`` finds the fastest DeepSpeed configuration that fits."""
