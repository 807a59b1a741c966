"""How a config section takes the keys it does not set from another section (``StackConfig.INHERITS``: a
decoder's ``cross_attention`` from its ``attention``). The inherited keys stay unset (``model_fields_set``), so
that a config written to be read again (``WRITTEN``, ``dump_config``) can leave them out and they follow their
source there, as in the file they came from. Apart from the schema because writing a config needs it too.
"""

from __future__ import annotations

from pydantic import BaseModel

# The serialization context of a config written to be read again (``dump_config``): keys a section inherits
# (``StackConfig.INHERITS``) are left out, where every other dump (``model_dump()``, what resumes compare) holds
# the values the run uses.
WRITTEN = "written"


def inherited_keys(section: BaseModel, *, own: frozenset[str]) -> list[str]:
    """The keys of ``section`` that it takes from its source: those it does not set, but its ``own``."""
    return [key for key in type(section).model_fields if key not in section.model_fields_set and key not in own]


def inherit_unset(section: BaseModel, source: BaseModel, *, own: frozenset[str]) -> BaseModel:
    """``section`` with every key it does not set but its ``own`` taken from ``source``; those keys stay unset
    (``model_fields_set`` is the section's own), which is how a written config tells them from the ones set."""
    values = {**section.__dict__, **{key: getattr(source, key) for key in inherited_keys(section, own=own)}}
    return type(section).model_construct(_fields_set=set(section.model_fields_set), **values)
