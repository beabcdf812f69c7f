"""Migration scripts, oldest first by revision chain. Never import ``broker.store.tables`` here:
a migration is frozen at the schema it was written for."""
