"""numpy reference implementations of the DDTree ops (shared/DESIGN.md section 3)."""
