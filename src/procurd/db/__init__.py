"""Database access: engine, schema, migrations and the storage modules."""
