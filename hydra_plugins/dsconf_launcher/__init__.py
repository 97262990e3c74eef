"""Hydra launcher plugin: ``hydra/launcher=dsconf`` runs each sweep job as a torch distributed job."""
