"""Domain: states, transitions, canonical forms and validation rules. Standard library only, no I/O."""
