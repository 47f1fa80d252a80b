"""context layer."""
