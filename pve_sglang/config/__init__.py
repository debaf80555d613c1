"""The settings: pydantic models of every host and container setting, their validation and
the generated settings table (docs)."""
