"""dsconf's own nodes (``hf``, ``dist``) read against their schema model: unknown keys, types, bounds, choices.

The facts are the model's field metadata, checked by the same ``check_field`` as every DeepSpeed key, so a choice,
bound or type is stated once, in the schema. Only the wording of two cases differs from DeepSpeed's sections
(``check_model``): dsconf itself reads these nodes, so an unknown key is simply unknown (not "DeepSpeed ignores
it"), and these values never went through ``normalize``, so an ``"auto"`` where the field does not take it is
reported here (unless the field is typed ``Any``: such a field gives "auto" its own meaning).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, List

from dsconf.errors import Problem, did_you_mean, join_path
from dsconf.schema.introspect import fields_of, unwrap_optional
from dsconf.validation.normalize import auto_source, deepspeed_auto, is_auto
from dsconf.validation.structure import check_field
from dsconf.versions import LATEST_KNOWN


def settings_problems(given: Mapping[str, Any], model: type, path: str) -> List[Problem]:
    """A problem for each key of ``given`` (the node at ``path``) that ``model``'s fields do not allow."""
    known = fields_of(model)
    problems = [Problem(join_path(path, str(key)), "unknown key", did_you_mean(str(key), known))
                for key in given if key not in known]
    for name, (tp, field) in known.items():
        if name not in given:
            continue
        where = join_path(path, name)
        typed = unwrap_optional(tp)[0] is not Any  # an Any field reads its own "auto" (dist.nproc_per_node)
        if typed and is_auto(given[name]) and not (auto_source(field) or deepspeed_auto(field)):
            problems.append(Problem(where, "'auto' is not allowed", field.metadata.get("help", "")))
            continue
        check_field(given[name], tp, field, model, dict(given), where, LATEST_KNOWN, problems)
    return problems
