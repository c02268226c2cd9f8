"""JSON Schema documents as data: the JSON-pointer walk and the sub-schema walk.

The definition loader checks a declared exit schema with these walks and the clone's exit judge
prepares the same schema for its bounded validator with them, so both read a schema the same
way. This package imports only the standard library: it sits below every other package.
"""

from clonefleet.json_schema._pointer import escape_token as escape_token
from clonefleet.json_schema._pointer import local_ref_target as local_ref_target
from clonefleet.json_schema._pointer import resolve_pointer as resolve_pointer
from clonefleet.json_schema._walk import Subschema as Subschema
from clonefleet.json_schema._walk import defined_schemas as defined_schemas
from clonefleet.json_schema._walk import schema_nodes as schema_nodes
from clonefleet.json_schema._walk import subschemas as subschemas

__all__ = [
    "Subschema",
    "defined_schemas",
    "escape_token",
    "local_ref_target",
    "resolve_pointer",
    "schema_nodes",
    "subschemas",
]
