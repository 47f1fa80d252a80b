"""Storage: SQLAlchemy Core tables, engines, the unit of work and repositories."""
