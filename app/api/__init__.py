"""HTTP API: routes, schemas, auth and problem+json. Routes call only the facade."""
