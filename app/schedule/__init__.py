"""Slot arithmetic of schedules (PROVISIONAL copy by h-schedules; h-slots' version replaces it)."""
