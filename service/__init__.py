"""gradvault.service."""
