"""The base every spec section derives from: frozen, unknown keys refused, field docstrings
kept as descriptions (so `qsync-opt spec` documents each field where it is declared)."""

from pydantic import BaseModel, ConfigDict

SPEC_CONFIG = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True, populate_by_name=True)


class SpecModel(BaseModel):
    model_config = SPEC_CONFIG
