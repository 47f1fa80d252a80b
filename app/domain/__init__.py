"""Domain: states, transitions, canonical forms and validation rules; stdlib only, no I/O."""
