"""Test kit shared across tiers (root conftest fixtures build on it)."""
