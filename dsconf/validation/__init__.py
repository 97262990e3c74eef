"""Validation of a DeepSpeed config dict: schema structure, legacy keys, cross-field rules."""

from dsconf.validation.legacy import LegacyKeyWarning, translate_legacy
from dsconf.validation.rules import check_rules
from dsconf.validation.structure import check_model

__all__ = ["LegacyKeyWarning", "check_model", "check_rules", "translate_legacy"]
