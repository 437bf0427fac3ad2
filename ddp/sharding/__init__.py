"""The machinery of fsdp: units and their shards, a unit's state at run time, the flat gradient buffers units share."""
